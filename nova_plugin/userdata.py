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

import email.policy
import gzip
import json
import zlib
from email.mime.application import MIMEApplication
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText
from typing import Any

from nova_plugin.exceptions import TenantError
from verifier.protocol import MalformedError
from verifier.protocol import userdata as _pure
from verifier.protocol.userdata import (
    BOOTSTRAP_PATH,
    COMPRESSED_MAGIC,
    PAYLOAD_TYPE,
    BootstrapConfig,
)

__all__ = [
    "BOOTSTRAP_PATH",
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
#: prefix of a payload compressed before sealing (see node_agent.payload)


class UserDataTooLargeError(TenantError):
    """The user-data exceeds Nova's limit even after compression."""


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
    """The bootstrap configuration (as its JSON object) and the payload
    envelope of user-data made by :func:`build_user_data`; the parser is
    :func:`verifier.protocol.userdata.parse_user_data`, which the agent
    uses too.

    Raises:
        ValueError: not such a document.
    """
    try:
        parsed = _pure.parse_user_data(user_data)
    except MalformedError as exc:
        raise ValueError(str(exc)) from exc
    return parsed.config.to_dict(), parsed.envelope
