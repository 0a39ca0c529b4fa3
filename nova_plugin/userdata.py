"""Cloud-init user-data for a trusted boot (protocol step: boot, flow 1).

The user-data Nova stores and serves to the guest is a MIME multipart
document with two parts:

``text/cloud-config``
    writes the agent's bootstrap configuration (registrar URL, CA
    certificate, the boot id the payload envelope is bound to) to
    ``/etc/trusted-cloud/bootstrap.json``.
``application/x-trusted-cloud-payload``
    the payload envelope (AES-256-GCM under K, see
    :mod:`verifier.protocol.envelope`), base64 transfer-encoded. Nova only
    ever sees this ciphertext.

Nova accepts at most 65,535 base64 characters of user-data, that is
49,149 raw bytes. The payload is compressed before it is sealed (when that
makes it smaller; the agent undoes it after opening, see
:func:`node_agent.payload.unwrap`), and the whole document is gzipped when
that helps (cloud-init decompresses gzip user-data itself).
"""

from __future__ import annotations

import dataclasses
import email
import email.policy
import gzip
import json
import zlib
from email.mime.application import MIMEApplication
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText
from typing import Any

from nova_plugin.exceptions import TenantError

__all__ = [
    "MAX_USER_DATA_BYTES",
    "PAYLOAD_TYPE",
    "BootstrapConfig",
    "UserDataTooLargeError",
    "build_user_data",
    "compress_payload",
    "parse_user_data",
]

#: 65,535 base64 characters decode to at most 16,383 * 3 bytes.
MAX_USER_DATA_BYTES = (65535 // 4) * 3
PAYLOAD_TYPE = "application/x-trusted-cloud-payload"
BOOTSTRAP_PATH = "/etc/trusted-cloud/bootstrap.json"
#: prefix of a payload compressed before sealing (see node_agent.payload)
COMPRESSED_MAGIC = b"TCZ1"


class UserDataTooLargeError(TenantError):
    """The user-data exceeds Nova's limit even after compression."""


@dataclasses.dataclass(frozen=True)
class BootstrapConfig:
    """What the guest's agent needs before it can register.

    Attributes:
        boot_id: the UUID the payload envelope is bound to (one per boot
            request; all servers of a ``--min-count`` request share it).
        registrar_url: where the agent registers its TPM.
        ca_pem: the operator CA the agent trusts for the registrar.
    """

    boot_id: str
    registrar_url: str
    ca_pem: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": 1,
            "boot_id": self.boot_id,
            "registrar_url": self.registrar_url,
            "ca_pem": self.ca_pem,
        }


def compress_payload(payload: bytes) -> bytes:
    """The plaintext to seal: ``TCZ1`` + zlib(payload) if that is smaller."""
    packed = COMPRESSED_MAGIC + zlib.compress(payload, 9)
    return packed if len(packed) < len(payload) else payload


def build_user_data(config: BootstrapConfig, envelope: bytes) -> bytes:
    """The user-data for Nova, compressed if that helps.

    Raises:
        UserDataTooLargeError: more than :data:`MAX_USER_DATA_BYTES`.
    """
    doc = MIMEMultipart()
    cloud_config = {
        "write_files": [
            {
                "path": BOOTSTRAP_PATH,
                "permissions": "0644",
                "content": json.dumps(config.to_dict(), sort_keys=True),
            }
        ]
    }
    part = MIMEText("#cloud-config\n" + json.dumps(cloud_config), "cloud-config")
    part.add_header("Content-Disposition", 'attachment; filename="bootstrap.cfg"')
    doc.attach(part)
    sealed = MIMEApplication(envelope, "x-trusted-cloud-payload")
    sealed.add_header("Content-Disposition", 'attachment; filename="payload.sealed"')
    doc.attach(sealed)
    raw = doc.as_bytes(policy=email.policy.SMTP)
    packed = gzip.compress(raw, 9, mtime=0)
    user_data = packed if len(packed) < len(raw) else raw
    if len(user_data) > MAX_USER_DATA_BYTES:
        raise UserDataTooLargeError(
            f"the user-data is {len(user_data):,} bytes after compression "
            f"(sealed payload {len(envelope):,} bytes); Nova accepts at most "
            f"{MAX_USER_DATA_BYTES:,} bytes (65,535 base64 characters): make "
            "the payload smaller, or have it fetch the rest once it runs"
        )
    return user_data


def parse_user_data(user_data: bytes) -> tuple[dict[str, Any], bytes]:
    """The bootstrap configuration and the payload envelope of user-data
    made by :func:`build_user_data` (what the guest side reads).

    Raises:
        ValueError: not such a document.
    """
    if user_data[:2] == b"\x1f\x8b":
        user_data = gzip.decompress(user_data)
    msg = email.message_from_bytes(user_data, policy=email.policy.default)
    config: dict[str, Any] | None = None
    envelope: bytes | None = None
    for part in msg.walk():
        ctype = part.get_content_type()
        if ctype == "text/cloud-config":
            first, _, text = str(part.get_content()).partition("\n")
            if first.strip() != "#cloud-config":
                raise ValueError("cloud-config part without its header")
            files = json.loads(text)["write_files"]
            config = json.loads(files[0]["content"])
        elif ctype == PAYLOAD_TYPE:
            body = part.get_payload(decode=True)
            envelope = body if isinstance(body, bytes) else None
    if config is None or envelope is None:
        raise ValueError("not trusted-boot user-data")
    return config, envelope
