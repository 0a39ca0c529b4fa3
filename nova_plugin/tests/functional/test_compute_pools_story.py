"""The trusted compute pools story through Nova, host side (issue 29 item 6).

Nova 34 with two emulated compute hosts (:class:`~trusted_testing.nova.
libvirt_deploy.LibvirtNovaDeployment`, ``hosts=2``), its real Placement and
scheduler; the real verifier and registrar (:class:`~trusted_testing.
cluster.LocalCluster`) with ``[placement] trait_sync`` writing
``CUSTOM_ATTESTATION_TRUSTED`` to Nova's Placement and the registrar's host
gate on (``[registrar] host_trust = required``). Each compute host's
platform TPM and kernel are an :class:`~trusted_testing.hosttpm.
EmulatedHost` (a vendor-certified swtpm, a soft kernel's IMA list and
measured boot), whose swtpm local CA libvirt's ``swtpm_setup`` uses for
the vTPMs Nova makes there (``localca_dirs``); the CA is made at set-up
and measured each time it is read. Each host's CA is enrolled with the
registrar; its host agent (:mod:`trusted_testing.hostgate`, shared with the
gate story without Nova) runs on its platform TPM under the host's compute
node provider UUID, registered by its vendor EK certificate; the operator
enrols the host (``POST /v1/hosts``) with runtime and measured-boot
policies made from it.

Both hosts attested: both providers carry the trait and the registrar's
trust record of each says trusted with the CA digest its IMA list proves.
A trusted flavor boots, enrolled at once by its tenant as ``trusted-nova
boot`` does; the Nova listener (on Nova's real notifications, with the
verifier's operator certificate) tells the verifier which host (X) runs
it, and its agent is attested. An unknown program runs on X: its trait
goes (the time from the tamper is measured), the guest becomes
``host_untrusted``, the registrar refuses a new vTPM made on X with
``host_untrusted`` and takes one made on the other host (Y), nothing
registered is lost; a new trusted boot lands on Y, and ``openstack
attestation host evacuate`` moves the old guest there by live migration;
the listener follows the move and the guest stays ``host_untrusted``.

The guest boots a blank disk (no OS under TCG keeps the class short). Its
agent runs on the machine on a stand-in vTPM made on X by
:meth:`~trusted_testing.hosttpm.EmulatedHost.make_vtpm` for the instance
UUID (an EK certificate from X's CA naming the instance, as libvirt's
own), registered through the gate; not on the vTPM libvirt made for the
instance, whose swtpm is qemu's alone (its socket has one client, its
state is locked by that swtpm and encrypted with the host-held secret).
The registrar's placement records (the vTPM manager's instance hook in a
deployment) are written here with the operator's certificate. Batched deep
quotes: once the guest is attested, a later quote of its host commits to a
Merkle root over its guests' good quotes (the host's ``last_round``).
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
import uuid as uuid_mod
from typing import Any

import oslo_messaging
import testtools
from keystoneauth1 import noauth
from keystoneauth1 import session as ks_session
from oslo_config import cfg

from node_agent.exceptions import RegistrationError
from nova_plugin import osc_evacuate
from nova_plugin.evacuate import ComputeApi
from nova_plugin.tenant import Tenant
from nova_plugin.tests.functional.test_nova_libvirt import _missing
from trusted_testing.cluster import GOLDEN_MEASUREMENT, PCR, LocalCluster, free_port
from trusted_testing.cluster_node import NodeHandle
from trusted_testing.e2e import Http
from trusted_testing.hostgate import (
    GATE_VERIFIER_OPTIONS,
    enrol_host,
    enrol_host_ca,
    gate_registrar_options,
    https_call,
    new_vtpm,
    register_vtpm,
    registered,
    start_host_agent,
    write_vendor_bundle,
)
from trusted_testing.hosttpm import EmulatedHost, VendorCa
from trusted_testing.nova.compute_hosts import ComputeHost
from trusted_testing.nova.deploy import ADMIN_HEADERS
from trusted_testing.nova.libvirt_deploy import LibvirtNovaDeployment
from trusted_testing.procs import wait_until
from trusted_testing.swtpm import Swtpm
from verifier.common.tls import client_context
from verifier.common.tpm import Tpm
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
    vendor: VendorCa
    emulated: dict[str, EmulatedHost]
    vtpms: list[Swtpm]
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
        cls.vtpms = []
        cls.vendor = VendorCa()
        # each compute host's platform TPM and kernel: an emulated host, whose
        # swtpm local CA libvirt's swtpm_setup uses for the vTPMs made there
        dirs = [os.path.join(cls.tmp, f"emulated-{i}") for i in range(2)]
        localcas = [os.path.join(d, "swtpm-localca") for d in dirs]
        cls.nova = LibvirtNovaDeployment(
            os.path.join(cls.tmp, "nova"),
            hosts=2,
            shutdown_timeout=3,
            localca_dirs=localcas,
        )
        os.makedirs(cls.nova.workdir)
        cls.emulated = {
            h.name: EmulatedHost(d, h.name, cls.vendor, localca=ca)
            for h, d, ca in zip(cls.nova.hosts, dirs, localcas, strict=True)
        }
        bundle = write_vendor_bundle(cls.vendor, os.path.join(cls.tmp, "vendor.pem"))
        cls.cluster = LocalCluster(
            os.path.join(cls.tmp, "cluster"),
            nodes=0,
            interval=INTERVAL,
            verifier_options=dict(GATE_VERIFIER_OPTIONS),
            verifier_sections={"placement": {}},
            registrar_options=gate_registrar_options(bundle),
        )
        try:
            for emulated in cls.emulated.values():
                emulated.start()
            cls.nova.start()
            # the local CA made (swtpm_localca, as at a host's first vTPM) and
            # read by the host's kernel: measured
            for emulated in cls.emulated.values():
                emulated.make_vtpm(str(uuid_mod.uuid4()))
            cls.placement = PlacementClient.noauth(cls.nova.placement_url)
            cls.cluster.verifier_sections["placement"] = {
                "trait_sync": "true",
                "noauth": "true",
                "endpoint_override": cls.nova.placement_url,
                "retry_interval": "0.5",
            }
            cls.cluster.start_services()
            # each host's CA enrolled with the registrar; its agent on its
            # platform TPM, under its compute node's provider UUID
            cls.nodes = {}
            for i, h in enumerate(cls.nova.hosts):
                enrol_host_ca(cls.cluster, cls.emulated[h.name])
                cls.nodes[h.name] = start_host_agent(
                    cls.cluster, cls.emulated[h.name], h.provider, 90 + i
                )
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
                for vtpm in cls.vtpms:
                    vtpm.stop()
                for emulated in cls.emulated.values():
                    emulated.stop()
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
        """The operator enrols the host with its runtime and measured-boot
        policies, made from the emulated host as it is now."""
        directory = os.path.join(self.tmp, "policies")
        enrol_host(self.cluster, self.emulated[host.name], host.provider, directory)

    def trust(self, host: ComputeHost) -> dict[str, Any]:
        """The registrar's trust record of ``host`` (what the verifier said)."""
        url = f"{self.cluster.registrar_url}/v1/hosts/{host.name}/trust"
        status, data = https_call(self.cluster, "verifier", "GET", url)
        self.assertEqual(200, status, data)
        return dict(data)

    def new_vtpm(self, host: ComputeHost, uuid: str) -> Swtpm:
        """A vTPM for instance ``uuid`` made on ``host`` as libvirt makes it,
        its placement recorded at the registrar."""
        self.vtpms.append(new_vtpm(self.cluster, self.emulated[host.name], uuid))
        return self.vtpms[-1]

    def guest_agent(self, host: ComputeHost, uuid: str) -> NodeHandle:
        """The guest's agent on its stand-in vTPM made on ``host``, the boot
        measured into PCR 16 as the firmware would; it registers through the
        registrar's gate by its TPM (no client certificate)."""
        swtpm = self.new_vtpm(host, uuid)
        with Tpm(swtpm.tcti) as tpm:
            tpm.pcr_extend(PCR, GOLDEN_MEASUREMENT)
        node_dir = os.path.join(self.tmp, f"guest-{uuid}")
        os.makedirs(node_dir)
        node = NodeHandle(
            uuid=uuid,
            index=len(self.cluster.nodes) + 100,
            dir=node_dir,
            swtpm=swtpm,
            port=free_port(),
            agent_options={"cert_file": None, "key_file": None},
        )
        self.cluster.nodes.append(node)  # stopped with the cluster
        self.cluster.start_agent(node)
        return node

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
        # the verifier told the registrar: trusted, with the CA digest each
        # host's IMA list proves
        for host in (a, b):
            record = wait_until(
                lambda h=host: (r := self.trust(h))["trusted"] and r,
                30,
                what=f"{host.name} trusted at the registrar",
            )
            proven = self.emulated[host.name].proven_ca_sha256()
            self.assertEqual(proven, record["ca_sha256"], record)
            self.assertEqual(host.provider, record["provider"], record)
        guest = self.boot("trusted-pool-host", enrol=True)
        x = self.nova.compute_host(guest["OS-EXT-SRV-ATTR:host"])
        y = b if x is a else a
        self.emulated[x.name].read_ca()  # libvirt's swtpm_localca read it
        # its agent (on a vTPM made on x standing in for the one qemu holds)
        # registers through the gate; the verifier attests it, under host x
        self.nodes[guest["id"]] = self.guest_agent(x, guest["id"])
        shown = wait_until(
            lambda: (s := self.status(guest["id"]))["state"] == "attested" and s,
            60,
            step=0.5,
            what="the guest attested",
        )
        self.assertEqual({"name": x.name, "trusted": True}, _host(shown), shown)
        # batched deep quote: a later quote of host x commits to a Merkle
        # root over its guests' good quotes of the interval, this one's too
        batched = wait_until(
            lambda: (
                (r := self.operator("GET", f"/v1/hosts/{x.name}")["last_round"])
                and r["guests"] >= 1
                and r
            ),
            30,
            step=0.2,
            what=f"a round of {x.name} batching its guest's quote",
        )
        self.assertEqual(64, len(batched["root"]), batched)

        # an unknown program runs on the guest's host
        begin = time.monotonic()
        self.emulated[x.name].run("/tmp/.x/miner", b"an unknown program")
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

        # the registrar refuses new vTPMs made on x, takes those made on y
        wait_until(lambda: not self.trust(x)["trusted"], 30, 0.1, f"{x.name} untrusted")
        refused, taken = str(uuid_mod.uuid4()), str(uuid_mod.uuid4())
        with self.assertRaises(RegistrationError) as ctx:
            register_vtpm(
                self.cluster, refused, self.new_vtpm(x, refused).tcti, self.vendor.pem()
            )
        self.assertIn("host_untrusted", str(ctx.exception))
        register_vtpm(
            self.cluster, taken, self.new_vtpm(y, taken).tcti, self.vendor.pem()
        )
        self.assertEqual(
            [False, True, True, True, True],
            [
                registered(self.cluster, uuid)
                for uuid in (refused, taken, guest["id"], a.provider, b.provider)
            ],
        )
        self.assertTrue(self.trust(y)["trusted"])

        # a new trusted boot lands on the other host only
        self.assertEqual(y.name, self.boot("trusted-pool")["OS-EXT-SRV-ATTR:host"])
        self.emulated[y.name].read_ca()

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
