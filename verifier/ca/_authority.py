"""A file-backed certificate authority built on ``cryptography``."""

from __future__ import annotations

import datetime
import os

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from verifier.common.tls import (
    private_pem,
    self_signed_builder,
    subject_alt_names,
    write_private,
)
from verifier.exceptions import VerifierError

_KEY = "ca-key.pem"
_CERT = "ca.pem"


class CaError(VerifierError):
    """The CA cannot load, or refuses to sign."""


class CertificateAuthority:
    """An ECDSA P-256 CA whose key and certificate live in one directory.

    Args:
        key: the CA private key.
        cert: the CA certificate.
    """

    def __init__(self, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate):
        self._key = key
        self.cert = cert

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @classmethod
    def create(cls, directory: str, common_name: str) -> CertificateAuthority:
        """Make a new CA in ``directory`` (ca-key.pem mode 0600, ca.pem)."""
        os.makedirs(directory, exist_ok=True)
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            self_signed_builder(key, common_name, days=3650)
            .add_extension(
                x509.KeyUsage(
                    False, False, False, False, False, True, True, False, False
                ),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        write_private(os.path.join(directory, _KEY), private_pem(key))
        with open(os.path.join(directory, _CERT), "wb") as f:
            f.write(cert.public_bytes(serialization.Encoding.PEM))
        return cls(key, cert)

    @classmethod
    def load(cls, directory: str) -> CertificateAuthority:
        """Load the CA from ``directory``.

        Raises:
            CaError: naming the missing or unreadable file.
        """
        try:
            with open(os.path.join(directory, _KEY), "rb") as f:
                key = serialization.load_pem_private_key(f.read(), None)
            with open(os.path.join(directory, _CERT), "rb") as f:
                cert = x509.load_pem_x509_certificate(f.read())
        except (OSError, ValueError) as exc:
            raise CaError(f"cannot load the CA from {directory}: {exc}")
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise CaError(f"CA key in {directory} is not an ECDSA key")
        return cls(key, cert)

    def _builder(self, common_name: str, days: int) -> x509.CertificateBuilder:
        now = datetime.datetime.now(datetime.UTC)
        return (
            x509.CertificateBuilder()
            .subject_name(
                x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
            )
            .issuer_name(self.cert.subject)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), True)
        )

    def issue(
        self, common_name: str, hosts: list[str], days: int = 825
    ) -> tuple[bytes, bytes]:
        """A key and certificate usable as both TLS server and client.

        Returns:
            (PEM private key, PEM certificate).
        """
        key = ec.generate_private_key(ec.SECP256R1())
        eku = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
        builder = self._builder(common_name, days).public_key(key.public_key())
        builder = builder.add_extension(x509.ExtendedKeyUsage(eku), False)
        if hosts:
            builder = builder.add_extension(subject_alt_names(hosts), False)
        cert = builder.sign(self._key, hashes.SHA256())
        return private_pem(key), cert.public_bytes(serialization.Encoding.PEM)

    def issue_to_files(self, directory: str, name: str, hosts: list[str]) -> None:
        """:meth:`issue` a certificate for ``name`` and write ``<name>.pem``
        and ``<name>-key.pem`` (mode 0600) in ``directory``."""
        key_pem, cert_pem = self.issue(name, hosts)
        write_private(os.path.join(directory, f"{name}-key.pem"), key_pem)
        with open(os.path.join(directory, f"{name}.pem"), "wb") as f:
            f.write(cert_pem)

    def sign_csr(self, csr_der: bytes, common_name: str, days: int = 30) -> bytes:
        """Issue a certificate for the key in ``csr_der`` with subject
        ``common_name`` (whatever the CSR asked for).

        Raises:
            CaError: if the CSR does not parse or its self-signature fails.
        """
        try:
            csr = x509.load_der_x509_csr(csr_der)
            valid = csr.is_signature_valid
        except ValueError as exc:
            raise CaError(f"CSR does not parse: {exc}")
        if not valid:
            raise CaError("CSR self-signature does not verify")
        eku = [ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.SERVER_AUTH]
        cert = (
            self._builder(common_name, days)
            .public_key(csr.public_key())
            .add_extension(x509.ExtendedKeyUsage(eku), False)
            .sign(self._key, hashes.SHA256())
        )
        return cert.public_bytes(serialization.Encoding.PEM)
