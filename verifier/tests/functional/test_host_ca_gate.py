"""The registrar's host gate on the real registrar process (trusted compute
pools, issue 29), without Nova.

An emulated compute host (:class:`trusted_testing.hosttpm.EmulatedHost`:
its platform swtpm with a vendor EK certificate, its soft kernel's IMA
list, its real ``swtpm_localca``) makes vTPMs whose EK certificates its
local CA signs. The host's CA is enrolled with the registrar
(``[registrar] host_trust = required``); the verifier's word on the host
is given here with the verifier's service certificate (``PUT
/v1/hosts/{host}/trust``), the digest being the one the host's IMA list
shows for its CA file. Each vTPM registers with the node agent's own
registration code (anonymously, TPM2_ActivateCredential on its swtpm).

The host agent is the real ``trusted-agent`` on the host's platform TPM,
under the host's resource provider UUID, with no bootstrap file and no
client certificate: the registrar takes it by its vendor EK certificate
(``ek_ca_bundle``), and it asks for no payload.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import shutil
import tempfile
import time
import unittest
import uuid as uuid_mod
from typing import Any, ClassVar

import testtools

from node_agent.exceptions import RegistrationError
from trusted_testing.cluster import LocalCluster
from trusted_testing.cluster_node import NodeHandle
from trusted_testing.hostgate import (
    gate_registrar_options,
    https_call,
    new_vtpm,
    register_vtpm,
    registered,
    start_host_agent,
    write_vendor_bundle,
)
from trusted_testing.hosttpm import CA_FILE, EmulatedHost, VendorCa
from trusted_testing.swtpm import Swtpm
from verifier.common.swtpm_localca import ek_ca_bundle
from verifier.common.tpm import Tpm
from verifier.protocol.ima.judge import evaluate
from verifier.protocol.ima.policy import RuntimePolicy

HOST = "compute-a"


def _iso(seconds: float) -> str:
    when = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    return when.isoformat().replace("+00:00", "Z")


def _needs(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        raise unittest.SkipTest(f"missing: {', '.join(missing)}")


class GateFixture(testtools.TestCase):
    """One registrar and verifier (a LocalCluster with the host gate on) and
    one emulated compute host per class, with the helpers the gate tests
    use; no tests of its own (other modules subclass it)."""

    tmp: ClassVar[str]
    cluster: ClassVar[LocalCluster]
    host: ClassVar[EmulatedHost]
    vendor: ClassVar[VendorCa]
    provider: ClassVar[str]
    vtpms: ClassVar[list[Swtpm]]
    #: ``[verifier]`` options of the cluster
    verifier_options: ClassVar[dict[str, Any]] = {}

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        _needs("swtpm", "swtpm_setup", "swtpm_localca")
        cls.tmp = tempfile.mkdtemp(prefix="host-ca-gate-")
        cls.vtpms = []
        cls.vendor = VendorCa()
        bundle = write_vendor_bundle(
            cls.vendor, os.path.join(cls.tmp, "ek-vendors.pem")
        )
        cls.provider = str(uuid_mod.uuid4())
        cls.host = EmulatedHost(os.path.join(cls.tmp, HOST), HOST, cls.vendor)
        cls.cluster = LocalCluster(
            os.path.join(cls.tmp, "cluster"),
            nodes=0,
            registrar_options=gate_registrar_options(bundle),
            verifier_options=dict(cls.verifier_options),
        )
        try:
            cls.host.start()
            cls.cluster.start_services()
        except BaseException:
            cls._clean()
            raise

    @classmethod
    def _clean(cls) -> None:
        cls.cluster.stop()
        for vtpm in cls.vtpms:
            vtpm.stop()
        cls.host.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def tearDownClass(cls) -> None:
        cls._clean()
        super().tearDownClass()

    # -- helpers ------------------------------------------------------------

    def call(
        self, who: str | None, method: str, path: str, body: Any = None
    ) -> tuple[int, Any]:
        """``method path`` on the registrar with ``who``'s certificate."""
        url = self.cluster.registrar_url + path
        return https_call(self.cluster, who, method, url, body)

    def say_trust(
        self, trusted: bool, digest: str | None, who: str = "verifier"
    ) -> Any:
        body = {
            "trusted": trusted,
            "ca_sha256": digest,
            "provider": self.provider,
            "as_of": _iso(time.time()),
        }
        status, data = self.call(who, "PUT", f"/v1/hosts/{HOST}/trust", body)
        self.assertEqual(200, status, data)
        return data

    def new_vtpm(self) -> tuple[str, Swtpm]:
        """A vTPM libvirt makes on the host for a new instance Nova placed
        there (:func:`trusted_testing.hostgate.new_vtpm`)."""
        uuid = str(uuid_mod.uuid4())
        self.vtpms.append(new_vtpm(self.cluster, self.host, uuid))
        return uuid, self.vtpms[-1]

    def register_vtpm(self, uuid: str, swtpm: Swtpm) -> None:
        """The guest agent's registration (anonymous, by its TPM).

        Raises:
            RegistrationError: the registrar refused.
        """
        register_vtpm(self.cluster, uuid, swtpm.tcti, self.vendor.pem())

    def refused_with(self, uuid: str, swtpm: Swtpm) -> str:
        with self.assertRaises(RegistrationError) as ctx:
            self.register_vtpm(uuid, swtpm)
        message = str(ctx.exception)
        self.assertIn("answered 403", message)
        return message

    def registered(self, uuid: str) -> bool:
        return registered(self.cluster, uuid)

    def start_host_agent(self) -> NodeHandle:
        """The real ``trusted-agent`` on the host's platform TPM, under its
        provider UUID (:func:`trusted_testing.hostgate.start_host_agent`)."""
        return start_host_agent(self.cluster, self.host, self.provider)


class HostCaGateTest(GateFixture):
    """The gate on the real registrar; the tests run in name order and
    build on each other."""

    policy: ClassVar[RuntimePolicy]

    def test_1_the_emulated_host_proves_its_ca_and_passes_its_policy(self) -> None:
        with Tpm(self.host.tcti) as tpm:
            cert = tpm.ek_certificate()
        assert cert is not None
        from cryptography import x509

        issuer = x509.load_der_x509_certificate(cert).issuer
        self.assertEqual(self.vendor.cert.subject, issuer)
        self.new_vtpm()  # swtpm_localca makes the CA and reads it: measured
        self.assertEqual(
            hashlib.sha256(self.host.ca_pem()).hexdigest(),
            self.host.proven_ca_sha256(),
        )
        assert self.host.kernel is not None
        # the operator's host policies, made from the host as it is now and
        # read back from the files an operator would enrol the host with
        runtime, mb = self.host.write_policies(os.path.join(self.tmp, "policies"))
        with open(runtime, encoding="utf-8") as f:
            type(self).policy = RuntimePolicy.from_dict(json.load(f))
        with open(mb, encoding="utf-8") as f:
            self.assertEqual(self.host.mb_policy(), json.load(f))
        entries = self.host.kernel.entries[1:]
        self.assertEqual([], evaluate(self.policy, entries, 1))
        status, data = self.call(
            "operator",
            "PUT",
            f"/v1/provider/hosts/{HOST}",
            {"ca_certificate": ek_ca_bundle(self.host.localca).decode()},
        )
        self.assertEqual(201, status, data)

    def test_2_host_agent_registers_by_its_vendor_ek_certificate(self) -> None:
        node = self.start_host_agent()
        status, data = self.call("verifier", "GET", f"/v1/agents/{self.provider}")
        self.assertIsNotNone(data["ek_certificate"])
        # no bootstrap file, no user-data: it serves, waiting for nothing
        assert node.proc is not None
        self.assertIsNone(node.proc.poll(), node.log)

    def test_3_vtpm_of_a_host_never_reported_is_refused(self) -> None:
        uuid, swtpm = self.new_vtpm()
        self.assertIn("host_untrusted", self.refused_with(uuid, swtpm))
        self.assertFalse(self.registered(uuid))

    def test_4_a_tenant_or_agent_certificate_may_not_say_a_hosts_trust(self) -> None:
        body = {
            "trusted": True,
            "ca_sha256": self.host.proven_ca_sha256(),
            "provider": self.provider,
            "as_of": _iso(time.time()),
        }
        for who in ("tenant", "agent"):
            status, data = self.call(who, "PUT", f"/v1/hosts/{HOST}/trust", body)
            self.assertEqual((403, "forbidden"), (status, data["error"]["code"]), who)
        status, data = self.call(None, "PUT", f"/v1/hosts/{HOST}/trust", body)
        self.assertEqual(401, status)
        status, data = self.call("tenant", "GET", f"/v1/hosts/{HOST}/trust")
        self.assertEqual(403, status)
        status, data = self.call("verifier", "GET", f"/v1/hosts/{HOST}/trust")
        self.assertEqual((200, None), (status, data["as_of"]))  # nothing stored

    def test_5_vtpm_of_a_trusted_host_with_its_proven_ca_registers(self) -> None:
        answer = self.say_trust(True, self.host.proven_ca_sha256())
        self.assertTrue(answer["applied"])
        uuid, swtpm = self.new_vtpm()
        self.register_vtpm(uuid, swtpm)
        self.assertTrue(self.registered(uuid))
        type(self).kept = uuid  # type: ignore[attr-defined]

    def test_6_trust_withdrawn_refuses_new_vtpms_and_keeps_the_registered(
        self,
    ) -> None:
        self.say_trust(False, self.host.proven_ca_sha256())
        uuid, swtpm = self.new_vtpm()
        self.assertIn("host_untrusted", self.refused_with(uuid, swtpm))
        self.assertFalse(self.registered(uuid))
        self.assertTrue(self.registered(self.kept))  # type: ignore[attr-defined]
        self.assertTrue(self.registered(self.provider))

    def test_7_a_swapped_ca_is_refused_with_host_ca_unproven(self) -> None:
        # a vTPM the enrolled CA certified, then the attacker's CA replaces
        # the host's: the IMA list shows a new digest for the CA file
        uuid, swtpm = self.new_vtpm()
        enrolled = self.host.proven_ca_sha256()
        self.host.swap_ca(VendorCa("swtpm-localca").pem())
        self.assertNotEqual(enrolled, self.host.proven_ca_sha256())
        assert self.host.kernel is not None
        failures = evaluate(self.policy, self.host.kernel.entries[1:], 1)
        self.assertEqual([CA_FILE], [f.path for f in failures])
        # even a verifier that still called the host attested reports the
        # digest the IMA list proves, which is not the enrolled CA's
        self.say_trust(True, self.host.proven_ca_sha256())
        self.assertIn("host_ca_unproven", self.refused_with(uuid, swtpm))
        self.assertTrue(self.registered(self.kept))  # type: ignore[attr-defined]
        self.assertTrue(self.registered(self.provider))

    def test_8_an_unknown_program_on_the_host_fails_its_policy(self) -> None:
        self.host.run("/tmp/.x/miner", b"an unknown program")
        assert self.host.kernel is not None
        failures = evaluate(self.policy, self.host.kernel.entries[1:], 1)
        self.assertIn("/tmp/.x/miner", [f.path for f in failures])
