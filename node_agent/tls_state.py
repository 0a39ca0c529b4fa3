"""The agent's TLS key and self-signed certificate, kept across restarts.

The registrar publishes the agent's certificate and verifiers and tenants
pin it (exact DER). A new key at each start would leave an attested node
``failed`` after an agent restart, so the key and certificate are created
once in the agent's state directory (``[agent] work_dir``, files 0600) and
reused at each start. They are made again only when they were made for
another node UUID or do not name the address the agent is contacted at;
a file that cannot be read or parsed is an error, never silently replaced.

Creating them survives a crash (a VM reset or killed a moment after the
agent started, found by the guest VM tests: the certificate was on disk,
the key was not): each file is written to a temporary name, synced and
renamed, the key first, and the directory is synced before the pair is
used. A key without its certificate is therefore a creation that a crash
interrupted before anyone could pin the certificate, and a new pair is
made; a certificate without its key cannot come from a crash and is an
error.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from node_agent.exceptions import NodeAgentError
from verifier.common.tls import self_signed_certificate

__all__ = ["CERT_FILE", "KEY_FILE", "load_or_create"]

KEY_FILE = "tls-key.pem"
CERT_FILE = "tls-cert.pem"


def load_or_create(state_dir: str, uuid: str, host: str) -> tuple[bytes, bytes]:
    """Return the agent's TLS key and certificate, creating them once.

    Args:
        state_dir: the directory holding ``tls-key.pem`` and ``tls-cert.pem``.
        uuid: the node UUID (the certificate's common name).
        host: the address the agent is contacted at (a subjectAltName).

    Returns:
        (PEM key, PEM certificate).

    Raises:
        NodeAgentError: the directory cannot be written, or a stored file is
            unreadable, corrupt, or its key does not match its certificate.
    """
    key_path = os.path.join(state_dir, KEY_FILE)
    cert_path = os.path.join(state_dir, CERT_FILE)
    try:
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        stored = _read(key_path, cert_path)
    except OSError as exc:
        raise NodeAgentError(f"cannot read the agent TLS state in {state_dir}: {exc}")
    if stored is not None and _fits(*stored, key_path, cert_path, uuid, host):
        return stored
    key_pem, cert_pem = self_signed_certificate(uuid, [host])
    try:
        _write(key_path, key_pem)
        _write(cert_path, cert_pem)
        _sync_dir(state_dir)
    except OSError as exc:
        raise NodeAgentError(f"cannot write the agent TLS state in {state_dir}: {exc}")
    return key_pem, cert_pem


def _read(key_path: str, cert_path: str) -> tuple[bytes, bytes] | None:
    """Both files, or None if there is no certificate (none yet, or a
    creation interrupted after the key was written)."""
    if not os.path.exists(cert_path):
        return None
    if not os.path.exists(key_path):
        raise NodeAgentError(
            f"corrupt agent TLS state: {key_path} is missing; remove "
            f"{cert_path} to make a new key (the node must then be enrolled again)"
        )
    with open(key_path, "rb") as key_file, open(cert_path, "rb") as cert_file:
        return key_file.read(), cert_file.read()


def _fits(
    key_pem: bytes, cert_pem: bytes, key_path: str, cert_path: str, uuid: str, host: str
) -> bool:
    """Whether the stored pair is this node's; raises if it is corrupt."""
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as exc:
        raise _corrupt(key_path, exc)
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError as exc:
        raise _corrupt(cert_path, exc)
    if not isinstance(key, ec.EllipticCurvePrivateKey) or (
        key.public_key() != cert.public_key()
    ):
        raise _corrupt(key_path, "the key does not match the certificate")
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if [n.value for n in names] != [uuid]:
        return False  # made for another node: make this node's
    with contextlib.suppress(x509.ExtensionNotFound):
        alt = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
        return _names(host) & set(alt.value) != set()
    return False


def _names(host: str) -> set[x509.GeneralName]:
    try:
        return {x509.IPAddress(ipaddress.ip_address(host))}
    except ValueError:
        return {x509.DNSName(host)}


def _corrupt(path: str, why: object) -> NodeAgentError:
    return NodeAgentError(
        f"corrupt agent TLS state in {path}: {why}; remove it to make a new "
        "key (the node must then be enrolled again)"
    )


def _write(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` (0600) atomically."""
    tmp = f"{path}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _sync_dir(path: str) -> None:
    """Make the renames in directory ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
