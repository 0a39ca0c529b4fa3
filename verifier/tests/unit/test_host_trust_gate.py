"""The registrar's host gate (``check_trusted_host_ek``): a vTPM EK
certificate from a compute host's CA counts only while that host is
attested and proved, through its IMA list, the very CA file enrolled for
it. One named test per attack; the certificates are made with cryptography
like swtpm's local CA makes them (issuer certificate file, then its root).
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import uuid as uuid_mod

import testtools
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from trusted_testing.softtpm import SoftTpm
from verifier.protocol import EvidenceError
from verifier.protocol.ekcert import load_host_ca
from verifier.protocol.hosttrust import (
    HostTrust,
    HostTrustMode,
    check_trusted_host_ek,
    issuer_file_part,
    proven_host_anchors,
)

NOW = datetime.datetime.now(datetime.UTC)
PROVIDER = str(uuid_mod.uuid4())
_Key = ec.EllipticCurvePrivateKey


def _cert(
    key: _Key, subject: str, issuer: x509.Certificate | None, public: object, ca: bool
) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer.subject if issuer is not None else name)
        .public_key(public)  # type: ignore[arg-type]
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - datetime.timedelta(days=1))
        .not_valid_after(NOW + datetime.timedelta(days=365))
    )
    if ca:
        builder = builder.add_extension(x509.BasicConstraints(True, None), True)
    return builder.sign(key, hashes.SHA256())


class LocalCa:
    """A host's swtpm local CA: a root and the issuer that signs EK certs."""

    def __init__(self) -> None:
        root_key = ec.generate_private_key(ec.SECP256R1())
        root = _cert(
            root_key, "swtpm-localca-rootca", None, root_key.public_key(), True
        )
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.issuer = _cert(
            root_key, "swtpm-localca", root, self.key.public_key(), True
        )
        self.issuer_file = self.issuer.public_bytes(serialization.Encoding.PEM)
        self.enrolled = self.issuer_file + root.public_bytes(serialization.Encoding.PEM)

    def ek_cert(self, public: object, uuid: str) -> bytes:
        cert = _cert(self.key, f"instance-00000001:{uuid}", self.issuer, public, False)
        return cert.public_bytes(serialization.Encoding.DER)


def _trust(trusted: bool, ca_file: bytes | None) -> HostTrust:
    digest = hashlib.sha256(ca_file).hexdigest() if ca_file is not None else None
    return HostTrust(trusted, digest, PROVIDER, NOW.timestamp())


class HostTrustGateTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.tpm = SoftTpm(ak_alg="ecc", ek_alg="ecc")
        self.uuid = str(uuid_mod.uuid4())
        self.ca = LocalCa()
        self.cert = self.ca.ek_cert(self.tpm.ek_key.public_key(), self.uuid)
        self.host_cas = {"compute-a": self.ca.enrolled}
        self.anchors = {"compute-a": load_host_ca(self.ca.enrolled)}

    def check(
        self,
        trust: HostTrust | None,
        mode: HostTrustMode = HostTrustMode.REQUIRED,
        cert: bytes | None = None,
    ) -> str:
        records = {"compute-a": trust} if trust is not None else {}
        try:
            check_trusted_host_ek(
                cert or self.cert,
                self.tpm.ek,
                self.uuid,
                "compute-a",
                self.anchors,
                NOW,
                mode=mode,
                host_cas=self.host_cas,
                host_trust=records,
            )
        except EvidenceError as exc:
            return exc.reason
        return "accepted"

    def test_ek_cert_from_a_trusted_host_with_its_proven_ca_is_accepted(self) -> None:
        self.assertEqual("accepted", self.check(_trust(True, self.ca.issuer_file)))

    def test_ca_enrolled_from_one_file_is_proven_by_that_files_digest(self) -> None:
        self.assertEqual("accepted", self.check(_trust(True, self.ca.enrolled)))

    def test_ek_cert_from_an_untrusted_hosts_ca_is_refused(self) -> None:
        self.assertEqual(
            "host_untrusted", self.check(_trust(False, self.ca.issuer_file))
        )

    def test_ek_cert_from_a_host_with_no_trust_record_is_refused(self) -> None:
        self.assertEqual("host_untrusted", self.check(None))

    def test_ek_cert_from_a_swapped_ca_is_refused(self) -> None:
        # the host now reads (and the IMA list shows) another CA file than
        # the one enrolled: an attacker's CA, swapped in on the host
        swapped = LocalCa()
        self.assertEqual(
            "host_ca_unproven", self.check(_trust(True, swapped.issuer_file))
        )

    def test_ek_cert_from_a_swapped_ca_enrolled_and_proven_is_judged_by_the_new_ca(
        self,
    ) -> None:
        # the swapped CA re-enrolled and proven: the old CA's certificates
        # no longer chain (enrolment replaces, the proof names the new file)
        swapped = LocalCa()
        self.host_cas = {"compute-a": swapped.enrolled}
        self.anchors = {"compute-a": load_host_ca(swapped.enrolled)}
        trust = _trust(True, swapped.issuer_file)
        self.assertEqual("ek_certificate_other_host", self.check(trust))

    def test_ek_cert_from_a_host_that_proved_no_ca_file_is_refused(self) -> None:
        self.assertEqual("host_ca_unproven", self.check(_trust(True, None)))

    def test_proof_of_the_root_file_alone_proves_no_issuer(self) -> None:
        # the digest of the root's part only: the issuer that signs EK
        # certificates is not what the host proved
        root_part = self.ca.enrolled[len(self.ca.issuer_file) :]
        self.assertEqual("host_ca_unproven", self.check(_trust(True, root_part)))

    def test_host_trust_off_keeps_the_old_behaviour(self) -> None:
        for trust in (None, _trust(False, None), _trust(True, LocalCa().issuer_file)):
            self.assertEqual("accepted", self.check(trust, HostTrustMode.OFF))
        other = LocalCa().ek_cert(self.tpm.ek_key.public_key(), self.uuid)
        self.assertEqual(
            "ek_certificate_other_host",
            self.check(None, HostTrustMode.OFF, cert=other),
        )

    def test_missing_certificate_is_named_before_the_gate(self) -> None:
        try:
            check_trusted_host_ek(
                None,
                self.tpm.ek,
                self.uuid,
                "compute-a",
                self.anchors,
                NOW,
                mode=HostTrustMode.REQUIRED,
                host_cas=self.host_cas,
                host_trust={},
            )
        except EvidenceError as exc:
            self.assertEqual("ek_certificate_missing", exc.reason)
        else:
            self.fail("accepted without a certificate")

    def test_proven_anchors_of_the_issuer_file_are_the_issuer_only(self) -> None:
        anchors = proven_host_anchors(
            "compute-a", self.ca.enrolled, _trust(True, self.ca.issuer_file)
        )
        self.assertEqual([self.ca.issuer], anchors)

    def test_issuer_file_part_keeps_crlf(self) -> None:
        text = self.ca.issuer_file.replace(b"\n", b"\r\n")
        self.assertEqual(text, issuer_file_part(text + b"more"))
        self.assertIsNone(issuer_file_part(b"no pem here"))


class GateAtActivationTest(testtools.TestCase):
    """The registrar judges the host gate again when the challenge is
    answered: a host that lost its trust after a vTPM registered cannot
    have that registration put in force (a soft TPM activates)."""

    def setUp(self) -> None:
        super().setUp()
        import os
        import tempfile

        from verifier.db import make_engine, upgrade
        from verifier.registrar import Registrar

        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.engine = make_engine("sqlite:///" + os.path.join(tmp.name, "r.db"))
        self.addCleanup(self.engine.dispose)
        upgrade(self.engine)
        self.registrar = Registrar(self.engine)
        self.tpm = SoftTpm(ak_alg="ecc", ek_alg="rsa")
        self.uuid = str(uuid_mod.uuid4())
        self.ca = LocalCa()
        hosts = self.registrar.hosts
        hosts.put_host_ca("compute-a", self.ca.enrolled.decode(), "vtpm-manager")
        hosts.put_placement(self.uuid, "compute-a", "listener")

    def say(self, trusted: bool) -> None:
        trust = _trust(trusted, self.ca.issuer_file)
        now = datetime.datetime.now(datetime.UTC).timestamp()
        self.registrar.hosts.put_trust(
            "compute-a", dataclasses.replace(trust, as_of=now)
        )

    def register(self) -> bytes:
        from verifier.registrar.service import Registration

        cert = self.ca.ek_cert(self.tpm.ek_key.public_key(), self.uuid)
        reg = Registration(
            uuid=self.uuid,
            ek_public=self.tpm.ek.to_bytes(),
            ek_certificate=cert,
            ak_public=self.tpm.ak.to_bytes(),
            tls_cert="-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n",
            host="192.0.2.7",
            port=8892,
        )
        challenge = self.registrar.register(reg, True)
        return self.tpm.activate_credential(
            challenge.credential_blob, challenge.encrypted_secret
        )

    def test_activation_after_the_host_lost_its_trust_is_refused(self) -> None:
        from verifier.exceptions import RequestError

        self.say(True)
        credential = self.register()
        self.say(False)
        with self.assertRaises(RequestError) as ctx:
            self.registrar.activate(self.uuid, credential)
        self.assertEqual(
            (403, "host_untrusted"), (ctx.exception.status, ctx.exception.code)
        )
        self.assertEqual([], self.registrar.list())
        # trusted again (the host was repaired): the same answer is taken
        self.say(True)
        self.registrar.activate(self.uuid, credential)
        self.assertTrue(self.registrar.get(self.uuid).activated)

    def test_activation_while_the_host_stays_trusted_puts_it_in_force(self) -> None:
        self.say(True)
        self.registrar.activate(self.uuid, self.register())
        self.assertTrue(self.registrar.get(self.uuid).activated)
