"""The host-CA binding of a Nova vTPM's EK (``check_host_bound_ek``): one
test per attack on it.

Each compute host's swtpm local CA signs the EK certificates of the vTPMs
libvirt makes there, with subject CN ``<domain>:<instance uuid>``. Both
hosts' CAs here carry the same subject (``swtpm-localca``, as swtpm writes
it), so only the signature tells them apart.
"""

from __future__ import annotations

import datetime
import uuid as uuid_mod

import testtools
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from trusted_testing.softtpm import SoftTpm
from verifier.protocol import EvidenceError
from verifier.protocol.ekcert import check_host_bound_ek

NOW = datetime.datetime.now(datetime.UTC)
_CA = tuple[ec.EllipticCurvePrivateKey, x509.Certificate]


def _ca() -> _CA:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "swtpm-localca")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - datetime.timedelta(days=1))
        .not_valid_after(NOW + datetime.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _ek_cert(
    ca: _CA, public_key: object, common_name: str | None, days: int = 365
) -> bytes:
    key, ca_cert = ca
    subject = (
        [x509.NameAttribute(NameOID.COMMON_NAME, common_name)] if common_name else []
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(subject))
        .issuer_name(ca_cert.subject)
        .public_key(public_key)  # type: ignore[arg-type]
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - datetime.timedelta(days=2))
        .not_valid_after(NOW + datetime.timedelta(days=days))
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.DER)


class HostBoundEkTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.tpm = SoftTpm(ak_alg="ecc", ek_alg="ecc")
        self.uuid = str(uuid_mod.uuid4())
        self.host_a, self.host_b = _ca(), _ca()
        self.anchors = {"compute-a": [self.host_a[1]], "compute-b": [self.host_b[1]]}

    def cert(self, ca: _CA | None = None, cn: str | None = "", **kw: int) -> bytes:
        name = f"instance-00000001:{self.uuid}" if cn == "" else cn
        return _ek_cert(ca or self.host_a, self.tpm.ek_key.public_key(), name, **kw)

    def check(self, cert: bytes | None, host: str | None = "compute-a") -> str:
        try:
            check_host_bound_ek(cert, self.tpm.ek, self.uuid, host, self.anchors, NOW)
        except EvidenceError as exc:
            return exc.reason
        return "accepted"

    def test_vtpm_of_this_instance_on_its_host_is_accepted(self) -> None:
        self.assertEqual("accepted", self.check(self.cert()))

    def test_cn_uuid_in_upper_case_is_the_same_instance(self) -> None:
        cert = self.cert(cn=f"instance-00000001:{self.uuid.upper()}")
        self.assertEqual("accepted", self.check(cert))

    def test_attack_ek_certificate_from_another_hosts_ca(self) -> None:
        # a vTPM made on compute-b claims an instance placed on compute-a
        cert = self.cert(self.host_b)
        self.assertEqual("ek_certificate_other_host", self.check(cert))
        with self.assertRaises(EvidenceError) as ctx:
            check_host_bound_ek(
                cert, self.tpm.ek, self.uuid, "compute-a", self.anchors, NOW
            )
        self.assertIn("'compute-b'", ctx.exception.detail)

    def test_attack_ek_certificate_from_an_unenrolled_ca(self) -> None:
        self.assertEqual("ek_certificate_other_host", self.check(self.cert(_ca())))

    def test_attack_cn_naming_another_instance(self) -> None:
        cert = self.cert(cn=f"instance-00000002:{uuid_mod.uuid4()}")
        self.assertEqual("ek_certificate_other_instance", self.check(cert))

    def test_attack_cn_naming_no_instance(self) -> None:
        self.assertEqual("ek_certificate_no_instance", self.check(self.cert(cn=None)))
        cert = self.cert(cn="instance-00000001")
        self.assertEqual("ek_certificate_no_instance", self.check(cert))

    def test_attack_no_ek_certificate(self) -> None:
        self.assertEqual("ek_certificate_missing", self.check(None))

    def test_attack_certificate_for_another_key(self) -> None:
        other = SoftTpm(ak_alg="ecc", ek_alg="ecc").ek_key.public_key()
        cert = _ek_cert(self.host_a, other, f"instance-00000001:{self.uuid}")
        self.assertEqual("ek_certificate", self.check(cert))

    def test_attack_expired_certificate(self) -> None:
        self.assertEqual("ek_certificate", self.check(self.cert(days=-1)))

    def test_attack_garbage_certificate(self) -> None:
        self.assertEqual("ek_certificate", self.check(b"\x30\x03junk"))

    def test_attack_instance_not_placed_by_nova(self) -> None:
        self.assertEqual("instance_host_unknown", self.check(self.cert(), None))

    def test_attack_host_without_enrolled_ca(self) -> None:
        cert = self.cert()
        self.assertEqual("host_ca_unknown", self.check(cert, "compute-c"))

    def test_attack_other_hosts_ca_cannot_stand_in_for_an_unenrolled_host(
        self,
    ) -> None:
        self.anchors["compute-c"] = []
        self.assertEqual("host_ca_unknown", self.check(self.cert(), "compute-c"))
