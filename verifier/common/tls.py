"""TLS contexts for mutual TLS between the services and the node agents.

Services (registrar, verifier) present certificates from the operator's CA
and require client certificates from it. A node agent presents a
self-signed certificate that it registers with the registrar; the verifier
and the tenant pin exactly that certificate when they connect to it.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from verifier.common._tls_watch import (
    log_refusals,
    refusal_hint,
    remember_client_certificate,
    warn_if_expiring,
)
from verifier.common.errors import CommonError

__all__ = [
    "PinMismatchError",
    "check_pin",
    "client_context",
    "pinned_client_context",
    "pinned_der",
    "pinning_client_context",
    "private_pem",
    "refusal_hint",
    "self_signed_builder",
    "self_signed_certificate",
    "server_context",
    "server_context_from_pem",
    "subject_alt_names",
    "write_private",
]


def server_context(
    cert_file: str, key_file: str, ca_file: str, client_cert_optional: bool = False
) -> ssl.SSLContext:
    """A server context that requires a client certificate signed by
    ``ca_file``: TLS 1.3 only, no session resumption (a session never
    outlives the certificate that opened it).

    Args:
        cert_file: our certificate (PEM).
        key_file: its key.
        ca_file: the CAs that sign client certificates.
        client_cert_optional: accept clients without a certificate (a
            certificate that is presented must still verify); the
            application then decides what anonymous callers may do.
    """
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=ca_file)
    ctx.load_cert_chain(cert_file, key_file)
    with open(cert_file, "rb") as f:
        warn_if_expiring(cert_file, f.read())
    ctx.verify_mode = ssl.CERT_OPTIONAL if client_cert_optional else ssl.CERT_REQUIRED
    _no_resumption(ctx)
    log_refusals(ctx)
    return ctx


def _no_resumption(ctx: ssl.SSLContext) -> None:
    """TLS 1.3 only, and no session ticket: no session is ever resumed.

    A resumed session skips the client certificate's verification, so a
    session made before the certificate expired (or its CA was dropped)
    would let its holder in after (issue 33). TLS 1.2 resumes by session
    ID from the server's cache as well as by ticket, and :mod:`ssl` cannot
    switch that cache off; a TLS 1.3 server that sends no ticket resumes
    nothing. Every client of these servers speaks TLS 1.3 (Python's
    :mod:`ssl`, aiohttp, requests and keystoneauth, the node agent).
    Sending no ticket also spares each client a 16 KB OpenSSL buffer per
    kept-alive connection (issue 19).
    """
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.options |= ssl.OP_NO_TICKET
    ctx.num_tickets = 0


def server_context_from_pem(
    cert_pem: bytes, key_pem: bytes, ca_pem: str, workdir: str
) -> ssl.SSLContext:
    """Like :func:`server_context` for in-memory PEM (written to ``workdir``,
    since :mod:`ssl` loads chains only from files)."""
    cert_file = os.path.join(workdir, "tls-cert.pem")
    key_file = os.path.join(workdir, "tls-key.pem")
    with open(cert_file, "wb") as f:
        f.write(cert_pem)
    write_private(key_file, key_pem)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cadata=ca_pem)
    ctx.load_cert_chain(cert_file, key_file)
    warn_if_expiring(cert_file, cert_pem)
    ctx.verify_mode = ssl.CERT_REQUIRED
    _no_resumption(ctx)
    log_refusals(ctx)
    return ctx


def client_context(
    cert_file: str | None, key_file: str | None, ca_file: str | None
) -> ssl.SSLContext:
    """A client context presenting our certificate, trusting ``ca_file``.

    Args:
        cert_file: our certificate (PEM); None: present none.
        key_file: its key (None: in ``cert_file``).
        ca_file: the CAs trusted for servers; None: the system's.

    Raises:
        OSError: a file cannot be read (:class:`ssl.SSLError`: not PEM).
    """
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert_file:
        ctx.load_cert_chain(cert_file, key_file)
        remember_client_certificate(ctx, cert_file)
    return ctx


def pinned_client_context(
    cert_file: str, key_file: str, pinned_cert_pem: str
) -> ssl.SSLContext:
    """A client context that accepts exactly one (self-signed) server cert."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=pinned_cert_pem)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = False  # the certificate itself is pinned
    ctx.load_cert_chain(cert_file, key_file)
    remember_client_certificate(ctx, cert_file)
    return ctx


def write_private(path: str, data: bytes) -> None:
    """Write secret material to ``path``, readable by the owner only."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def private_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    """PKCS#8 PEM of ``key`` (unencrypted: protect the file instead)."""
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def subject_alt_names(hosts: list[str]) -> x509.SubjectAlternativeName:
    """IP addresses and DNS names as a subjectAltName extension."""
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def pinning_client_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """One client context for every pinned peer: OpenSSL does not judge the
    server's certificate, the caller compares it byte for byte with the
    pinned one right after the handshake (see :func:`pinned_der`). One
    context serves any number of agents (a context per agent costs tens of
    kilobytes)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # pinned below, by exact DER comparison
    ctx.load_cert_chain(cert_file, key_file)
    remember_client_certificate(ctx, cert_file)
    return ctx


def pinned_der(cert_pem: str) -> bytes:
    """The DER form of a pinned PEM certificate.

    Raises:
        ValueError: if it is not a PEM certificate.
    """
    return x509.load_pem_x509_certificate(cert_pem.encode()).public_bytes(
        serialization.Encoding.DER
    )


class PinMismatchError(ssl.SSLError, CommonError):
    """The peer's certificate is not the pinned one.

    Also an :class:`ssl.SSLError`: it fails the connection like any other
    TLS failure (an ``OSError`` to the connection code).
    """


def check_pin(ssl_object: ssl.SSLObject | ssl.SSLSocket | None, pin: bytes) -> None:
    """Accept the peer of a finished handshake only if its certificate is
    exactly ``pin`` (DER, see :func:`pinned_der`).

    Raises:
        PinMismatchError: another certificate, or none.
    """
    peer = ssl_object.getpeercert(binary_form=True) if ssl_object else None
    if peer != pin:
        raise PinMismatchError("server certificate is not the pinned one")


def self_signed_builder(
    key: ec.EllipticCurvePrivateKey, common_name: str, days: int
) -> x509.CertificateBuilder:
    """A builder for a self-signed certificate of ``key`` valid ``days``
    (from five minutes ago), marked as a CA that signs no intermediates;
    callers add their own extensions and sign with ``key``."""
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
    )


def self_signed_certificate(
    common_name: str, hosts: list[str], days: int = 365
) -> tuple[bytes, bytes]:
    """A fresh P-256 key and self-signed certificate (PEM key, PEM cert)."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        self_signed_builder(key, common_name, days)
        .add_extension(subject_alt_names(hosts), critical=False)
        .sign(key, hashes.SHA256())
    )
    return private_pem(key), cert.public_bytes(serialization.Encoding.PEM)
