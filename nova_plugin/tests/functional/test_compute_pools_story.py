"""The trusted compute pools story through Nova, host side (issue 29 item 6).

Nova 34 with two emulated compute hosts (:class:`~trusted_testing.nova.
libvirt_deploy.LibvirtNovaDeployment`, ``hosts=2``), its real Placement and
scheduler; the real verifier and registrar (:class:`~trusted_testing.
cluster.LocalCluster`) with ``[placement] trait_sync`` writing
``CUSTOM_ATTESTATION_TRUSTED`` to Nova's Placement. Each compute host's
host agent is the node agent on its own swtpm, registered under the host's
compute node resource provider UUID and enrolled by the operator as a host
(``POST /v1/hosts``). Both hosts attested: both providers carry the trait,
a trusted flavor boots, enrolled at once by its tenant as ``trusted-nova
boot`` does; the Nova listener (on Nova's real notifications, with the
verifier's operator certificate) tells the verifier which host runs it,
and its agent is attested. Something unknown runs on the guest's host: its
trait goes (the time from the tamper is measured), the guest becomes
``host_untrusted``, a new trusted boot lands on the other host, and
``openstack attestation host evacuate`` moves the old guest there by live
migration; the listener follows the move and the guest stays
``host_untrusted``.

The guest boots a blank disk (no OS under TCG keeps the class short): its
agent runs on the machine, on an swtpm standing in for its vTPM, under
the instance's UUID. Not here yet: the registrar's gate on the host's local
CA (i29-registrar) and batched deep quotes.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import shutil
import sys
import tempfile
import time
from typing import Any

import oslo_messaging
import testtools
from keystoneauth1 import noauth
from keystoneauth1 import session as ks_session
from oslo_config import cfg

from nova_plugin import osc_evacuate
from nova_plugin.evacuate import ComputeApi
from nova_plugin.tenant import Tenant
from nova_plugin.tests.functional.test_nova_libvirt import _missing
from trusted_testing.cluster import LocalCluster
from trusted_testing.e2e import Http
from trusted_testing.nova.compute_hosts import ComputeHost
from trusted_testing.nova.deploy import ADMIN_HEADERS
from trusted_testing.nova.libvirt_deploy import LibvirtNovaDeployment
from trusted_testing.procs import wait_until
from verifier.common.tls import client_context
from verifier.nova_listener.listener import (
    InstanceEndpoint,
    VerifierOperator,
    make_listener,
)
from verifier.placement import PlacementClient
from verifier.protocol import PcrPolicy
from verifier.protocol.enroller import commit_u
from verifier.protocol.shares import KEY_BYTES, split

TRAIT = "CUSTOM_ATTESTATION_TRUSTED"
#: seconds between host quotes
INTERVAL = 0.5
TIMES: dict[str, float] = {}


def _host(status: dict[str, Any]) -> dict[str, Any]:
    host = status.get("host") or {}
    return {"name": host.get("name"), "trusted": host.get("trusted")}


class ComputePoolsStoryTest(testtools.TestCase):
    """One Nova of two hosts and one verifier + registrar for the class."""

    tmp: str
    nova: LibvirtNovaDeployment
    cluster: LocalCluster
    placement: PlacementClient
    nodes: dict[str, Any]
    loop: asyncio.AbstractEventLoop
    tenant: Tenant
    transport: Any
    listener: Any

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        problem = _missing() or (
            None if shutil.which("bindfs") else "bindfs is not installed"
        )
        if problem:
            raise testtools.TestCase.skipException(problem)
        begin = time.monotonic()
        cls.tmp = tempfile.mkdtemp(prefix="trusted-pools-story-")
        cls.nova = LibvirtNovaDeployment(
            os.path.join(cls.tmp, "nova"), hosts=2, shutdown_timeout=3
        )
        os.makedirs(cls.nova.workdir)
        cls.cluster = LocalCluster(
            os.path.join(cls.tmp, "cluster"),
            nodes=0,
            interval=INTERVAL,
            verifier_sections={"placement": {}},
        )
        try:
            cls.nova.start()
            cls.placement = PlacementClient.noauth(cls.nova.placement_url)
            cls.cluster.verifier_sections["placement"] = {
                "trait_sync": "true",
                "noauth": "true",
                "endpoint_override": cls.nova.placement_url,
                "retry_interval": "0.5",
            }
            cls.cluster.start_services()
            # each host's agent, under its compute node's provider UUID
            cls.nodes = {
                h.name: cls.cluster.add_node(h.provider) for h in cls.nova.hosts
            }
            cls.image_id = cls.nova.add_blank_image()
            cls.loop = asyncio.new_event_loop()
            cls.tenant = cls.cluster.tenant()
            cls._listen()
        except BaseException:
            cls._clean()
            raise
        TIMES["setUpClass"] = time.monotonic() - begin

    @classmethod
    def _listen(cls) -> None:
        """The Nova listener (the verifier's operator certificate) on Nova's
        real notifications: it tells the verifier where each instance runs."""
        pki = cls.cluster.pki_file
        operator = VerifierOperator(
            cls.cluster.verifier_url,
            client_context(pki("operator.pem"), pki("operator-key.pem"), pki("ca.pem")),
        )
        conf = cfg.ConfigOpts()
        conf([])
        cls.transport = oslo_messaging.get_notification_transport(
            conf, url=cls.nova.transport_url
        )
        cls.listener = make_listener(cls.transport, InstanceEndpoint(operator))
        cls.listener.start()

    @classmethod
    def _clean(cls) -> None:
        if hasattr(cls, "listener"):
            cls.listener.stop()
            cls.listener.wait()
            cls.transport.cleanup()
        if hasattr(cls, "loop"):
            cls.loop.run_until_complete(cls.tenant.close())
            cls.loop.close()
        try:
            cls.cluster.stop()
        finally:
            try:
                cls.nova.stop()
            finally:
                shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def tearDownClass(cls) -> None:
        cls._clean()
        for name, seconds in TIMES.items():
            print(
                f"compute pools story timing: {name}: {seconds:.1f} s", file=sys.stderr
            )
        super().tearDownClass()

    # -- helpers ----------------------------------------------------------------

    def operator(self, method: str, path: str, **kw: Any) -> Any:
        resp = Http(self.cluster, "operator").call(
            method, f"{self.cluster.verifier_url}{path}", **kw
        )
        self.assertLess(resp.status_code, 300, resp.text)
        return resp.json() if resp.content else None

    def enrol(self, host: ComputeHost) -> None:
        """The operator enrols the host (its agent's PCR 16 as measured)."""
        policy = PcrPolicy.from_dict({"pcrs": {"16": [self.cluster.good_pcr_hex()]}})
        self.operator(
            "POST",
            "/v1/hosts",
            json={
                "provider": host.provider,
                "hypervisor_hostname": host.name,
                "policy": policy.to_dict(),
            },
        )

    def has_trait(self, host: ComputeHost) -> bool:
        return TRAIT in self.placement.get_traits(host.provider)[1]

    def status(self, uuid: str) -> dict[str, Any]:
        """The tenant's view of its node."""
        return dict(self.loop.run_until_complete(self.tenant.status(uuid)))

    def boot(self, flavor: str, enrol: bool = False) -> dict[str, Any]:
        """Boot, with ``enrol`` as ``trusted-nova boot`` does: the tenant
        enrols the instance at once (V, the policy, a commitment to U) and
        the verifier waits for Nova's word that it exists."""
        body = {
            "server": {
                "name": f"story-{flavor}",
                "imageRef": self.image_id,
                "flavorRef": flavor,
                "networks": "none",
            }
        }
        resp = self.nova.request("POST", "/servers", json=body, microversion="2.37")
        self.assertEqual(202, resp.status_code, resp.text)
        uuid = str(resp.json()["server"]["id"])
        if enrol:
            policy = PcrPolicy.from_dict(
                {"pcrs": {"16": [self.cluster.good_pcr_hex()]}}
            )
            u, v = split(os.urandom(KEY_BYTES))
            self.loop.run_until_complete(
                self.tenant.enrol_ahead(uuid, v, policy, commit_u(uuid, u))
            )
        server = wait_until(
            lambda: (
                (s := self.nova.server(uuid))
                and s["status"] in ("ACTIVE", "ERROR")
                and s
            ),
            300,
            step=1,
            what=f"{uuid} ACTIVE or ERROR",
        )
        self.assertEqual("ACTIVE", server["status"], server.get("fault"))
        return dict(server)

    def evacuate(self, host: str) -> tuple[int, list[str], str]:
        session = ks_session.Session(
            auth=noauth.NoAuth(endpoint=self.nova.api_url),
            additional_headers=ADMIN_HEADERS,
        )
        args = argparse.Namespace(host=host, dry_run=False, wait=True, timeout=300.0)
        out, err = io.StringIO(), io.StringIO()
        code = osc_evacuate.run(ComputeApi(session), args, out, err)
        return code, out.getvalue().splitlines(), err.getvalue()

    # -- the story ----------------------------------------------------------------

    def test_an_untrusted_host_loses_its_trait_and_its_guest_moves(self) -> None:
        a, b = self.nova.hosts
        for host in (a, b):
            self.assertFalse(self.has_trait(host))
            self.enrol(host)
        # both hosts attested: the verifier puts the trait on both providers
        begin = time.monotonic()
        for host in (a, b):
            wait_until(
                lambda h=host: self.has_trait(h), 60, what=f"{host.name} trusted"
            )
        TIMES["enrolment to both traits"] = time.monotonic() - begin
        guest = self.boot("trusted-pool-host", enrol=True)
        x = self.nova.compute_host(guest["OS-EXT-SRV-ATTR:host"])
        y = b if x is a else a
        # its agent (on an swtpm standing in for the vTPM of a guest that
        # boots no OS) registers; the verifier attests it, under host x
        self.nodes[guest["id"]] = self.cluster.add_node(guest["id"])
        shown = wait_until(
            lambda: (s := self.status(guest["id"]))["state"] == "attested" and s,
            60,
            step=0.5,
            what="the guest attested",
        )
        self.assertEqual({"name": x.name, "trusted": True}, _host(shown), shown)

        # an unknown program runs on the guest's host
        begin = time.monotonic()
        self.cluster.tamper(self.nodes[x.name])
        wait_until(lambda: not self.has_trait(x), 60, 0.05, f"{x.name}'s trait gone")
        TIMES["tamper to trait removed"] = time.monotonic() - begin
        shown = self.operator("GET", f"/v1/hosts/{x.name}")
        self.assertIs(False, shown["trusted"], shown)
        self.assertTrue(self.has_trait(y))
        # its guest is marked: a guest whose host was compromised is
        shown = wait_until(
            lambda: (s := self.status(guest["id"]))["state"] == "host_untrusted" and s,
            30,
            step=0.1,
            what="the guest host_untrusted",
        )
        TIMES["tamper to guest host_untrusted"] = time.monotonic() - begin
        self.assertEqual({"name": x.name, "trusted": False}, _host(shown), shown)

        # a new trusted boot lands on the other host only
        self.assertEqual(y.name, self.boot("trusted-pool")["OS-EXT-SRV-ATTR:host"])

        # the operator moves the old guest off the untrusted host
        code, lines, err = self.evacuate(x.name)
        self.assertEqual((0, ""), (code, err), lines)
        self.assertEqual(
            [f"{guest['id']} ({guest['name']}): moved to {y.name} by live migration"],
            lines,
        )
        self.assertEqual(
            y.name, (self.nova.server(guest["id"]) or {}).get("OS-EXT-SRV-ATTR:host")
        )
        # the listener tells the verifier where it runs now; the guest stays
        # host_untrusted (final: its vTPM was on the compromised host)
        shown = wait_until(
            lambda: (s := self.status(guest["id"]))["host"]["name"] == y.name and s,
            60,
            step=0.5,
            what="the guest placed on the other host",
        )
        self.assertEqual("host_untrusted", shown["state"], shown)
        self.assertIs(True, _host(shown)["trusted"], shown)
