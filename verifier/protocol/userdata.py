"""Trusted-boot user-data and the agent's bootstrap configuration
(ARCHITECTURE "Flows" 1 and 3: the boot wrapper writes them, cloud-init
delivers them, the node agent reads them).

The user-data Nova stores and serves to the guest is a MIME multipart
document (optionally gzipped as a whole; cloud-init undoes that itself,
but keeps its copy ``/var/lib/cloud/instance/user-data.txt`` as given):

``text/cloud-config``
    ``#cloud-config`` whose ``write_files`` writes the bootstrap
    configuration (:class:`BootstrapConfig`, JSON) to
    :data:`BOOTSTRAP_PATH`.
``application/x-trusted-cloud-payload``
    the payload envelope (AES-256-GCM under K, see
    :mod:`verifier.protocol.envelope`), base64 transfer-encoded.

Parsing is pure and raises only :class:`MalformedError`: what it parses
arrives from the cloud, which the tenant does not trust.
"""

from __future__ import annotations

import dataclasses
import email
import email.policy
import zlib
from typing import Any
from urllib.parse import urlsplit

from cryptography import x509

from verifier.protocol import jsonlimits
from verifier.protocol.envelope import canonical_uuid
from verifier.protocol.errors import MalformedError

__all__ = [
    "BOOTSTRAP_PATH",
    "COMPRESSED_MAGIC",
    "MAX_BOOTSTRAP_BYTES",
    "MAX_USER_DATA_INFLATED",
    "PAYLOAD_TYPE",
    "BootstrapConfig",
    "TrustedUserData",
    "parse_user_data",
]

PAYLOAD_TYPE = "application/x-trusted-cloud-payload"
BOOTSTRAP_PATH = "/etc/trusted-cloud/bootstrap.json"
#: The largest bootstrap configuration accepted (a CA bundle and two URLs).
MAX_BOOTSTRAP_BYTES = 256 * 1024
#: The largest user-data accepted once un-gzipped (Nova keeps at most
#: 49,149 raw bytes; the payload inside is compressed already).
MAX_USER_DATA_INFLATED = 1 << 20
#: Prefix of a payload plaintext the boot wrapper zlib-compressed before
#: sealing it (``nova_plugin.userdata`` writes it, ``node_agent.payload``
#: undoes it).
COMPRESSED_MAGIC = b"TCZ1"
_VERSION = 1
_STRUCTURE = "bootstrap configuration"


def _check_url(url: object, name: str = "registrar_url") -> str:
    if not isinstance(url, str) or not url or len(url) > 2048:
        raise MalformedError(_STRUCTURE, f"'{name}' must be a URL string")
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise MalformedError(
            _STRUCTURE, f"'{name}' {url!r} is not an http(s) URL with a host"
        )
    if parts.query or parts.fragment or parts.username or parts.password:
        raise MalformedError(
            _STRUCTURE, f"'{name}' must not carry credentials, query or fragment"
        )
    return url.rstrip("/")


def _check_ca(ca_pem: object) -> str | None:
    if ca_pem is None:
        return None
    if not isinstance(ca_pem, str) or len(ca_pem) > MAX_BOOTSTRAP_BYTES:
        raise MalformedError(_STRUCTURE, "'ca_pem' must be a PEM string")
    try:
        certs = x509.load_pem_x509_certificates(ca_pem.encode())
    except ValueError:
        certs = []
    if not certs:
        raise MalformedError(_STRUCTURE, "'ca_pem' holds no PEM certificate")
    return ca_pem


@dataclasses.dataclass(frozen=True)
class BootstrapConfig:
    """What the guest's agent needs before it can register.

    Attributes:
        boot_id: the UUID the payload envelope is bound to (one per boot
            request; all servers of a ``--min-count`` request share it),
            canonical form.
        registrar_url: where the agent registers its TPM (no trailing /).
        ca_pem: the operator CA bundle (PEM): it signs the registrar's
            server certificate and the client certificates (verifier,
            tenant) allowed to call the agent. None: the agent's own
            configuration must name one.
        push_url: the verifier's push endpoint when the node is enrolled in
            push mode (``trusted-nova boot --mode push``): the agent then
            pushes its evidence there and opens no port. None: the agent's
            configuration (or the provider's vendor-data) decides.

    Raises:
        MalformedError: a field that is not what it names.
    """

    boot_id: str
    registrar_url: str
    ca_pem: str | None = None
    push_url: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.boot_id, str):
            raise MalformedError(_STRUCTURE, "'boot_id' must be a UUID string")
        object.__setattr__(self, "boot_id", canonical_uuid(self.boot_id))
        object.__setattr__(self, "registrar_url", _check_url(self.registrar_url))
        object.__setattr__(self, "ca_pem", _check_ca(self.ca_pem))
        if self.push_url is not None:
            object.__setattr__(self, "push_url", _check_url(self.push_url, "push_url"))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "version": _VERSION,
            "boot_id": self.boot_id,
            "registrar_url": self.registrar_url,
            "ca_pem": self.ca_pem,
        }
        if self.push_url is not None:  # a pull node's file is as before
            out["push_url"] = self.push_url
        return out

    @classmethod
    def from_dict(cls, data: object) -> BootstrapConfig:
        """Raises: MalformedError: not a version-1 configuration."""
        if not isinstance(data, dict):
            raise MalformedError(_STRUCTURE, "not a JSON object")
        if data.get("version") != _VERSION:
            raise MalformedError(
                _STRUCTURE, f"unsupported version {data.get('version')!r}"
            )
        known = {"version", "boot_id", "registrar_url", "ca_pem", "push_url"}
        unknown = set(data) - known
        if unknown:
            raise MalformedError(_STRUCTURE, f"unknown fields {sorted(unknown)}")
        if "boot_id" not in data or "registrar_url" not in data:
            raise MalformedError(_STRUCTURE, "'boot_id' and 'registrar_url' needed")
        return cls(
            data["boot_id"],
            data["registrar_url"],
            data.get("ca_pem"),
            data.get("push_url"),
        )

    @classmethod
    def from_json(cls, raw: bytes) -> BootstrapConfig:
        """Parse the file's bytes.

        Raises:
            MalformedError: too large, not JSON or not a configuration.
        """
        if len(raw) > MAX_BOOTSTRAP_BYTES:
            raise MalformedError(_STRUCTURE, f"larger than {MAX_BOOTSTRAP_BYTES} bytes")
        try:
            data = jsonlimits.loads(raw, _STRUCTURE)
        except MalformedError as exc:  # depth, integers, syntax: named
            raise MalformedError(_STRUCTURE, f"not JSON: {exc.detail}") from None
        return cls.from_dict(data)


@dataclasses.dataclass(frozen=True)
class TrustedUserData:
    """The two parts of trusted-boot user-data."""

    config: BootstrapConfig
    envelope: bytes


def _inflate(data: bytes) -> bytes:
    if data[:2] != b"\x1f\x8b":
        return data
    inflater = zlib.decompressobj(wbits=31)  # gzip
    try:
        out = inflater.decompress(data, MAX_USER_DATA_INFLATED + 1)
    except zlib.error as exc:
        raise MalformedError("user-data", f"corrupt gzip: {exc}")
    if len(out) > MAX_USER_DATA_INFLATED or not inflater.eof:
        raise MalformedError("user-data", "gzip is truncated or inflates too far")
    return out


def _config_of(text: str) -> BootstrapConfig:
    first, _, body = text.partition("\n")
    if first.strip() != "#cloud-config":
        raise MalformedError("user-data", "cloud-config part without its header")
    try:
        doc = jsonlimits.loads(body, "user-data")
        content = doc["write_files"][0]["content"]
        path = doc["write_files"][0]["path"]
    except (MalformedError, KeyError, IndexError, TypeError) as exc:
        raise MalformedError("user-data", f"cloud-config part is not ours: {exc!r}")
    if path != BOOTSTRAP_PATH or not isinstance(content, str):
        raise MalformedError("user-data", "cloud-config part writes no bootstrap file")
    return BootstrapConfig.from_json(content.encode())


def parse_user_data(user_data: bytes) -> TrustedUserData:
    """The bootstrap configuration and the payload envelope of user-data
    made by ``nova_plugin.userdata.build_user_data``.

    Raises:
        MalformedError: not such a document (or gzip that inflates too far).
    """
    raw = _inflate(user_data)
    try:
        msg = email.message_from_bytes(raw, policy=email.policy.default)
        parts = [(p.get_content_type(), p) for p in msg.walk()]
    except (ValueError, TypeError, LookupError) as exc:
        raise MalformedError("user-data", f"not a MIME document: {exc}")
    config: BootstrapConfig | None = None
    envelope: bytes | None = None
    for ctype, part in parts:
        try:
            if ctype == "text/cloud-config":
                config = _config_of(str(part.get_content()))
            elif ctype == PAYLOAD_TYPE:
                body = part.get_payload(decode=True)
                envelope = body if isinstance(body, bytes) and body else None
        except (ValueError, TypeError, LookupError) as exc:
            raise MalformedError("user-data", f"unreadable {ctype} part: {exc}")
    if config is None or envelope is None:
        raise MalformedError("user-data", "not trusted-boot user-data")
    return TrustedUserData(config, envelope)
