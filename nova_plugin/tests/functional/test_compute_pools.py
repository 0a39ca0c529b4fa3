"""Integration: trusted compute pools with Nova's own scheduler.

Two emulated compute hosts (:class:`~trusted_testing.nova.libvirt_deploy.
LibvirtNovaDeployment` with ``hosts=2``: two nova-computes, each with its
own libvirtd, swtpm local CA and compute node resource provider), the real
Placement 16 and Nova 34's scheduler. A flavor with
``trait:CUSTOM_ATTESTATION_TRUSTED=required`` (or an image with that
property) is placed only on a host whose provider carries the trait; with
none, the boot ends in ERROR with "No valid host". The trait is written
by the verifier's :class:`~verifier.placement.TraitSync` (keeping every
trait Nova set). ``openstack attestation host evacuate`` moves a host's
guests through Nova's API: a vTPM guest with
``hw:tpm_secret_security=host`` by live migration, others by cold
migration, each to the host the scheduler finds (the trusted one), or says
Nova's reason when there is none.

The guests boot a blank disk (no OS: what is tested is where Nova puts a
vTPM guest and that libvirt starts it there, not what runs inside).
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import sys
import tempfile
import time
import uuid as uuid_mod
from typing import Any

import oslo_messaging
import requests
import testtools
from keystoneauth1 import noauth
from keystoneauth1 import session as ks_session
from oslo_config import cfg

from nova_plugin import osc_evacuate
from nova_plugin.evacuate import ComputeApi
from nova_plugin.tests.functional.test_nova_libvirt import _missing
from trusted_testing.nova.compute_hosts import ComputeHost
from trusted_testing.nova.deploy import ADMIN_HEADERS
from trusted_testing.nova.libvirt_deploy import (
    PLACEMENT_HEADERS,
    LibvirtNovaDeployment,
)
from verifier.nova_listener.hooks import NoopHook
from verifier.nova_listener.listener import (
    InstanceEndpoint,
    VerifierOperator,
    make_listener,
)
from verifier.placement import PlacementClient, TraitSync

TRAIT = "CUSTOM_ATTESTATION_TRUSTED"
ACTIVE_TIMEOUT = 600.0
#: how long each part of the class took (setUpClass and each test), seconds
TIMES: dict[str, float] = {}


class _Placements(NoopHook):
    """An instance hook recording where the Nova listener says each
    instance runs (as the ``vtpm`` hook tells the registrar)."""

    def __init__(self) -> None:
        super().__init__()
        self.hosts: dict[str, list[str]] = {}

    def instance_placed(self, uuid: str, host: str) -> None:
        self.hosts.setdefault(uuid, []).append(host)


class _NoVerifier(VerifierOperator):
    """The verifier's answer for instances nobody enrolled (404)."""

    def __init__(self) -> None:
        super().__init__("http://127.0.0.1:9", None)

    def instance_created(self, uuid: str) -> bool:
        return False

    def unenrol(self, uuid: str) -> bool:
        return False

    def place(self, uuid: str, host: str) -> bool:
        return False


class _Timed(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        begin = time.monotonic()
        self.addCleanup(lambda: TIMES.__setitem__(self.id(), time.monotonic() - begin))


class ComputePoolsTest(_Timed):
    """One deployment of two compute hosts for the whole class."""

    tmp: str
    nova: LibvirtNovaDeployment
    transport: Any
    listener: Any
    placements: _Placements
    placement: PlacementClient
    traits: TraitSync
    image_id: str
    trusted_image_id: str

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        problem = _missing() or (
            None if shutil.which("bindfs") else "bindfs is not installed"
        )
        if problem:
            raise testtools.TestCase.skipException(problem)
        begin = time.monotonic()
        cls.tmp = tempfile.mkdtemp(prefix="trusted-compute-pools-")
        # a guest that boots no OS ignores ACPI: Nova's clean power off
        # before a cold migration would wait its full minute
        # host B's local CA lives elsewhere (as an emulated host's would)
        cls.nova = LibvirtNovaDeployment(
            cls.tmp,
            hosts=2,
            shutdown_timeout=3,
            localca_dirs=[None, os.path.join(cls.tmp, "host-b-localca")],
        )
        try:
            cls.nova.start()
            resp = requests.put(
                f"{cls.nova.placement_url}/traits/{TRAIT}",
                headers=PLACEMENT_HEADERS,
                timeout=30,
            )
            resp.raise_for_status()
            cls.placement = PlacementClient.noauth(cls.nova.placement_url)
            cls.traits = TraitSync(cls.placement, TRAIT, retry_interval=1.0)
            # the Nova listener on Nova's real notifications
            conf = cfg.ConfigOpts()
            conf([])
            cls.transport = oslo_messaging.get_notification_transport(
                conf, url=cls.nova.transport_url
            )
            cls.placements = _Placements()
            endpoint = InstanceEndpoint(_NoVerifier(), [cls.placements])
            cls.listener = make_listener(cls.transport, endpoint, pool="pools")
            cls.listener.start()
            cls.image_id = cls.nova.add_blank_image()
            cls.trusted_image_id = cls.nova.add_blank_image(
                {f"trait:{TRAIT}": "required"}
            )
        except BaseException:
            cls.nova.stop()
            shutil.rmtree(cls.tmp, ignore_errors=True)
            raise
        TIMES["setUpClass"] = time.monotonic() - begin

    @classmethod
    def tearDownClass(cls) -> None:
        try:
            cls.listener.stop()
            cls.listener.wait()
            cls.transport.cleanup()
            cls.nova.stop()
        finally:
            shutil.rmtree(cls.tmp, ignore_errors=True)
        for name, seconds in TIMES.items():
            print(f"compute pools timing: {name}: {seconds:.1f} s", file=sys.stderr)
        super().tearDownClass()

    # -- helpers ----------------------------------------------------------------

    @property
    def host_a(self) -> ComputeHost:
        return self.nova.hosts[0]

    @property
    def host_b(self) -> ComputeHost:
        return self.nova.hosts[1]

    def trusted(self, *hosts: ComputeHost) -> None:
        """Exactly ``hosts`` carry the trait (the verifier's TraitSync
        writes it, as for hosts it finds attested)."""
        for host in self.nova.hosts:
            self.traits.want(host.provider, host in hosts)
        self.assertEqual({}, self.traits.pump())
        self.addCleanup(self._untrust_all)

    def _untrust_all(self) -> None:
        for host in self.nova.hosts:
            self.traits.want(host.provider, False)
        self.assertEqual({}, self.traits.pump())

    def provider_traits(self, host: ComputeHost) -> set[str]:
        return self.placement.get_traits(host.provider)[1]

    def boot(self, flavor: str, image: str | None = None) -> dict[str, Any]:
        """Boot and wait for ACTIVE or ERROR; the server as an admin sees it."""
        body = {
            "server": {
                "name": f"pool-{flavor}",
                "imageRef": image or self.image_id,
                "flavorRef": flavor,
                "networks": "none",
            }
        }
        resp = self.nova.request("POST", "/servers", json=body, microversion="2.37")
        self.assertEqual(202, resp.status_code, resp.text)
        uuid = str(resp.json()["server"]["id"])
        self.addCleanup(self._delete, uuid)
        return self.wait_status(uuid, ("ACTIVE", "ERROR"))

    def wait_status(
        self, uuid: str, statuses: tuple[str, ...], timeout: float = ACTIVE_TIMEOUT
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        server: dict[str, Any] | None = None
        while time.monotonic() < deadline:
            server = self.nova.server(uuid)
            if server and server["status"] in statuses:
                return server
            time.sleep(1)
        raise AssertionError(f"{uuid} never reached {statuses}: {server}")

    def _delete(self, uuid: str) -> None:
        resp = self.nova.request("DELETE", f"/servers/{uuid}")
        if resp.status_code == 404:
            return
        self.assertEqual(204, resp.status_code, resp.text)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and self.nova.server(uuid) is not None:
            time.sleep(1)

    def assert_on(self, host: ComputeHost, server: dict[str, Any]) -> None:
        self.assertEqual("ACTIVE", server["status"], server.get("fault"))
        self.assertEqual(host.name, server["OS-EXT-SRV-ATTR:host"])
        self.assertIn(server["id"], host.domain_uuids())
        other = [h for h in self.nova.hosts if h is not host]
        for h in other:
            self.assertNotIn(server["id"], h.domain_uuids())

    def assert_no_valid_host(self, server: dict[str, Any]) -> None:
        self.assertEqual("ERROR", server["status"])
        self.assertIn("No valid host", server.get("fault", {}).get("message", ""))
        self.assertIsNone(server.get("OS-EXT-SRV-ATTR:host"))

    # -- the deployment -----------------------------------------------------------

    def test_two_hosts_each_with_its_libvirtd_ca_and_provider(self) -> None:
        a, b = self.host_a, self.host_b
        self.assertNotEqual(a.name, b.name)
        self.assertNotEqual(a.provider, b.provider)
        self.assertNotEqual(a.uri, b.uri)
        self.assertEqual(a.name, a.virsh("hostname").strip())
        self.assertEqual(b.name, b.virsh("hostname").strip())
        resp = self.nova.request(
            "GET", "/os-hypervisors/detail", admin=True, microversion="2.53"
        )
        self.assertEqual(200, resp.status_code, resp.text)
        ids = {h["service"]["host"]: h["id"] for h in resp.json()["hypervisors"]}
        self.assertEqual({a.name: a.provider, b.name: b.provider}, ids)
        self.assertNotIn(TRAIT, self.provider_traits(a))
        self.assertIn("COMPUTE_SECURITY_TPM_2_0", self.provider_traits(b))

    # -- scheduling by trait ------------------------------------------------------

    def test_trusted_flavor_without_a_trusted_host_is_no_valid_host(self) -> None:
        self.trusted()
        self.assert_no_valid_host(self.boot("trusted-pool"))

    def test_trusted_flavor_lands_on_the_host_with_the_trait(self) -> None:
        self.trusted(self.host_b)
        self.assert_on(self.host_b, self.boot("trusted-pool"))
        # Nova's own reports keep the trait it did not set, and the trait's
        # writes kept the traits Nova set
        # its vTPM's EK certificate came from host B's local CA
        ca = os.path.join(self.tmp, "host-b-localca", "issuercert.pem")
        self.assertEqual(os.path.dirname(ca), self.host_b.localca_dir)
        self.assertTrue(os.path.exists(ca))
        traits = self.provider_traits(self.host_b)
        self.assertIn(TRAIT, traits)
        self.assertIn("COMPUTE_SECURITY_TPM_2_0", traits)
        self.assertNotIn(TRAIT, self.provider_traits(self.host_a))

    def test_trusted_image_without_a_trusted_host_is_no_valid_host(self) -> None:
        self.trusted()
        self.assert_no_valid_host(self.boot("trusted-vtpm", self.trusted_image_id))

    def test_trusted_image_lands_on_the_host_with_the_trait(self) -> None:
        self.trusted(self.host_a)
        self.assert_on(self.host_a, self.boot("trusted-vtpm", self.trusted_image_id))

    # -- openstack attestation host evacuate -----------------------------------------

    def evacuate(self, host: str, *options: str) -> tuple[int, list[str], str]:
        """``openstack attestation host evacuate`` as an admin (Nova's API
        over a keystoneauth session, as the ``openstack`` client gives)."""
        session = ks_session.Session(
            auth=noauth.NoAuth(endpoint=self.nova.api_url),
            additional_headers=ADMIN_HEADERS,
        )
        args = argparse.Namespace(
            host=host,
            dry_run="--dry-run" in options,
            wait="--wait" in options,
            timeout=300.0,
        )
        out, err = io.StringIO(), io.StringIO()
        code = osc_evacuate.run(ComputeApi(session), args, out, err)
        return code, out.getvalue().splitlines(), err.getvalue()

    def line_of(self, lines: list[str], uuid: str) -> str:
        found = [line for line in lines if line.startswith(uuid)]
        self.assertEqual(1, len(found), lines)
        return found[0]

    def test_evacuate_moves_each_guest_to_the_trusted_host(self) -> None:
        a, b = self.host_a, self.host_b
        self.trusted(a)
        cold = self.boot("trusted-pool")
        live = self.boot("trusted-pool-host")
        self.assert_on(a, cold)
        self.assert_on(a, live)
        # A fails its attestation: its trait moves to B
        self.trusted(b)

        # by its provider's UUID, as the verifier names hosts
        code, lines, err = self.evacuate(a.provider, "--dry-run")
        self.assertEqual((0, ""), (code, err))
        self.assertIn("would move by cold migration", self.line_of(lines, cold["id"]))
        self.assertIn("would move by live migration", self.line_of(lines, live["id"]))
        self.assert_on(a, self.nova.server(cold["id"]) or {})

        begin = time.monotonic()
        code, lines, err = self.evacuate(a.name, "--wait")
        TIMES["evacuate two guests (cold + live)"] = time.monotonic() - begin
        self.assertEqual((0, ""), (code, err), lines)
        self.assertEqual(
            f"moved to {b.name} by cold migration",
            self.line_of(lines, cold["id"]).split(": ", 1)[1],
        )
        self.assertEqual(
            f"moved to {b.name} by live migration",
            self.line_of(lines, live["id"]).split(": ", 1)[1],
        )
        for server in (cold, live):
            self.assert_on(b, self.wait_status(server["id"], ("ACTIVE",)))
            # the vTPM's state went with the guest
            self.assertTrue(os.path.isdir(os.path.join(b.root, "swtpm", server["id"])))
            self.assertFalse(
                os.path.exists(os.path.join(a.root, "swtpm", server["id"]))
            )
            # the Nova listener learnt where it runs now (the move's end)
            self.assert_placed(server["id"], [a.name, b.name])
        code, lines, _ = self.evacuate(a.name, "--wait")
        self.assertEqual((0, [f"{a.name}: no guests"]), (code, lines))

    def assert_placed(self, uuid: str, hosts: list[str]) -> None:
        """The listener's hook heard ``uuid`` placed on ``hosts`` (in
        order, repeats of one host folded)."""
        deadline = time.monotonic() + 60
        while True:
            heard = self.placements.hosts.get(uuid, [])
            folded = [h for i, h in enumerate(heard) if i == 0 or heard[i - 1] != h]
            if folded == hosts or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        self.assertEqual(hosts, folded, heard[-10:])

    def test_evacuate_says_why_a_guest_could_not_move(self) -> None:
        a = self.host_a
        self.trusted(a)  # the only other host is not trusted
        server = self.boot("trusted-pool")
        self.assert_on(a, server)
        code, lines, err = self.evacuate(a.name, "--wait")
        self.assertEqual((1, ""), (code, err))
        line = self.line_of(lines, server["id"])
        self.assertIn("could not: ", line)
        self.assertIn("No valid host", line)
        self.assert_on(a, self.wait_status(server["id"], ("ACTIVE",)))

    def test_evacuate_of_an_unknown_host_is_one_line_and_exit_2(self) -> None:
        code, lines, err = self.evacuate("no-such-host", "--wait")
        self.assertEqual((2, []), (code, lines))
        self.assertEqual(
            "no-such-host: no nova-compute service has that host name\n", err
        )
        unknown = str(uuid_mod.uuid4())
        code, lines, err = self.evacuate(unknown, "--wait")
        self.assertEqual((2, []), (code, lines))
        self.assertEqual(f"{unknown}: no compute node has that UUID\n", err)
