"""The CRL the ``ipsec`` action keeps (RFC 5280, section 5).

The CRL file is both what charon loads and the action's record of which
serials are revoked: adding a serial reads the current CRL, checks it was
signed by the configured CA, and re-signs it with the serial added and the
CRL number raised. Adding a serial that is already listed changes nothing.
"""

from __future__ import annotations

import datetime
import os
import tempfile

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa

from ipsec_puppet_vault_hooks.exceptions import HooksError

__all__ = ["CrlError", "CrlIssuer", "load_crl"]

_CaKey = (
    ec.EllipticCurvePrivateKey
    | rsa.RSAPrivateKey
    | ed25519.Ed25519PrivateKey
    | ed448.Ed448PrivateKey
)


class CrlError(HooksError):
    """The CA or the CRL file cannot be used."""


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise CrlError(f"cannot read the {what} {path}: {exc.strerror}") from exc


def load_crl(path: str) -> x509.CertificateRevocationList | None:
    """The CRL in ``path`` (PEM or DER), or None if there is no file.

    Raises:
        CrlError: if the file exists but cannot be read or parsed.
    """
    if not os.path.exists(path):
        return None
    data = _read(path, "CRL")
    try:
        if data.lstrip().startswith(b"-----"):
            return x509.load_pem_x509_crl(data)
        return x509.load_der_x509_crl(data)
    except ValueError as exc:
        raise CrlError(f"CRL {path} does not parse: {exc}") from exc


class CrlIssuer:
    """Issues the CRL of one CA.

    Args:
        cert: the CA certificate.
        key: the CA private key (must match ``cert``).
        lifetime: time from a CRL's thisUpdate to its nextUpdate.
    """

    def __init__(
        self, cert: x509.Certificate, key: _CaKey, lifetime: datetime.timedelta
    ) -> None:
        if key.public_key() != cert.public_key():
            raise CrlError("the CA key does not belong to the CA certificate")
        self.cert = cert
        self._key = key
        self.lifetime = lifetime

    @classmethod
    def from_files(
        cls, cert_path: str, key_path: str, lifetime: datetime.timedelta
    ) -> CrlIssuer:
        """Load the CA from PEM files.

        Raises:
            CrlError: naming the file that is missing or unusable.
        """
        try:
            cert = x509.load_pem_x509_certificate(_read(cert_path, "CA certificate"))
        except ValueError as exc:
            raise CrlError(f"CA certificate {cert_path} does not parse: {exc}")
        try:
            key = serialization.load_pem_private_key(_read(key_path, "CA key"), None)
        except (ValueError, TypeError) as exc:
            raise CrlError(f"CA key {key_path} does not load: {exc}") from exc
        if not isinstance(
            key,
            ec.EllipticCurvePrivateKey
            | rsa.RSAPrivateKey
            | ed25519.Ed25519PrivateKey
            | ed448.Ed448PrivateKey,
        ):
            raise CrlError(f"CA key {key_path} cannot sign a CRL")
        return cls(cert, key, lifetime)

    def _check(self, crl: x509.CertificateRevocationList, path: str) -> None:
        if crl.issuer != self.cert.subject or not crl.is_signature_valid(
            self.cert.public_key()  # type: ignore[arg-type]
        ):
            raise CrlError(f"CRL {path} was not issued by the configured CA")

    def _aki(self) -> x509.AuthorityKeyIdentifier:
        # strongSwan finds the CRL of an issuer by the issuer's key id, so
        # the CRL must name it.
        try:
            ski = self.cert.extensions.get_extension_for_class(
                x509.SubjectKeyIdentifier
            ).value
        except x509.ExtensionNotFound:
            return x509.AuthorityKeyIdentifier.from_issuer_public_key(
                self._key.public_key()
            )
        return x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski)

    def sign(
        self,
        revoked: list[x509.RevokedCertificate],
        number: int,
        now: datetime.datetime,
    ) -> x509.CertificateRevocationList:
        """Sign a CRL listing ``revoked`` with CRL number ``number``."""
        builder = (
            x509.CertificateRevocationListBuilder()
            .issuer_name(self.cert.subject)
            .last_update(now)
            .next_update(now + self.lifetime)
            .add_extension(x509.CRLNumber(number), critical=False)
            .add_extension(self._aki(), critical=False)
        )
        for entry in revoked:
            builder = builder.add_revoked_certificate(entry)
        algorithm = (
            None
            if isinstance(self._key, ed25519.Ed25519PrivateKey | ed448.Ed448PrivateKey)
            else hashes.SHA256()
        )
        return builder.sign(self._key, algorithm)

    def revoke(
        self, path: str, serial: int, now: datetime.datetime | None = None
    ) -> tuple[bytes, bool]:
        """Make sure the CRL in ``path`` lists ``serial``.

        Args:
            path: the CRL file; created if missing, replaced atomically.
            serial: the certificate serial number to revoke.
            now: the revocation time (default: the current time).

        Returns:
            (the CRL as PEM, whether the file changed).

        Raises:
            CrlError: if the existing CRL is unreadable or not this CA's.
        """
        now = now or datetime.datetime.now(datetime.UTC)
        current = load_crl(path)
        entries: list[x509.RevokedCertificate] = []
        number = 0
        if current is not None:
            self._check(current, path)
            if current.get_revoked_certificate_by_serial_number(serial) is not None:
                return current.public_bytes(serialization.Encoding.PEM), False
            entries = list(current)
            try:
                number = current.extensions.get_extension_for_class(
                    x509.CRLNumber
                ).value.crl_number
            except x509.ExtensionNotFound:
                number = 0
        entries.append(
            x509.RevokedCertificateBuilder()
            .serial_number(serial)
            .revocation_date(now)
            .add_extension(
                x509.CRLReason(x509.ReasonFlags.key_compromise), critical=False
            )
            .build()
        )
        pem = self.sign(entries, number + 1, now).public_bytes(
            serialization.Encoding.PEM
        )
        _write_atomic(path, pem)
        return pem, True


def _write_atomic(path: str, data: bytes) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".crl-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
