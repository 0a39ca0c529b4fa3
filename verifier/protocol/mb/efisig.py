"""UEFI signature databases: ``EFI_SIGNATURE_LIST`` and
``EFI_SIGNATURE_DATA`` (UEFI specification 2.10, section 32.4.1 "Signature
Database"), as firmware measures them into PCR 7.

The Secure Boot variables ``PK``, ``KEK``, ``db`` and ``dbx`` hold a
sequence of signature lists; each list has a type GUID, a header and
fixed-size entries of an owner GUID followed by the signature data (an
X.509 certificate in DER, a SHA-256 image digest...). An
``EV_EFI_VARIABLE_AUTHORITY`` event of firmware or shim names the one
entry (an ``EFI_SIGNATURE_DATA``) that verified a boot application.

An entry is compared by its *key* (:attr:`SignatureEntry.key`), a string a
tenant can write in a policy: ``x509:<sha256 of the certificate DER>``,
``sha256:<the image digest>``, or ``<type GUID>:<sha256 of the data>`` for
other types. The owner GUID is bookkeeping and not compared.

Pure: bytes in, values out; malformed input raises
:class:`~verifier.protocol.errors.MalformedError` naming the event and field.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import re
import struct
import uuid
from collections.abc import Iterable

from verifier.protocol.errors import MalformedError

__all__ = [
    "EFI_CERT_SHA256",
    "EFI_CERT_X509",
    "EFI_IMAGE_SECURITY_DATABASE",
    "SHIM_LOCK",
    "SignatureEntry",
    "entry_key",
    "key_from_text",
    "parse_signature_data",
    "parse_signature_lists",
    "signature_list",
]

EFI_CERT_SHA256 = uuid.UUID("c1c41626-504c-4092-aca9-41f936934328")
EFI_CERT_X509 = uuid.UUID("a5c059a1-94e4-4aa7-87b5-ab155c2bf072")
#: Vendor GUID of ``db``, ``dbx`` (and shim's ``vendor_db`` authority).
EFI_IMAGE_SECURITY_DATABASE = uuid.UUID("d719b2cb-3d3a-4596-a3bc-dad00e67656f")
#: shim's vendor GUID (``MokList``, ``SbatLevel``, its ``Shim`` authority).
SHIM_LOCK = uuid.UUID("605dab50-e046-4300-abb6-3dd810dd8b23")

_STRUCT = "EFI_SIGNATURE_LIST"
_HEADER = struct.Struct("<16sIII")
_OWNER = 16
_MAX_ENTRIES = 100_000
_HEX64 = re.compile(r"[0-9a-f]{64}")
_PEM = re.compile(
    r"-----BEGIN CERTIFICATE-----(.*?)-----END CERTIFICATE-----", re.DOTALL
)


def _sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def entry_key(sig_type: uuid.UUID, data: bytes) -> str:
    """The comparison key of signature ``data`` of type ``sig_type``."""
    if sig_type == EFI_CERT_X509:
        return "x509:" + _sha256(data).hex()
    if sig_type == EFI_CERT_SHA256 and len(data) == 32:
        return "sha256:" + data.hex()
    return f"{sig_type}:{_sha256(data).hex()}"


@dataclasses.dataclass(frozen=True, slots=True)
class SignatureEntry:
    """One ``EFI_SIGNATURE_DATA`` of a signature list.

    Attributes:
        sig_type: the list's ``SignatureType`` GUID.
        owner: the ``SignatureOwner`` GUID.
        data: the ``SignatureData`` bytes.
    """

    sig_type: uuid.UUID
    owner: uuid.UUID
    data: bytes

    @property
    def key(self) -> str:
        """The policy key of this entry (see the module doc)."""
        return entry_key(self.sig_type, self.data)


def parse_signature_lists(data: bytes, where: str) -> tuple[SignatureEntry, ...]:
    """Parse the contents of a signature database variable: zero or more
    ``EFI_SIGNATURE_LIST`` structures back to back.

    Args:
        data: the variable's data (may be empty: an unset variable).
        where: the position named in errors (``"event 12 (db)"``).

    Returns:
        Every entry, in order.

    Raises:
        MalformedError: a list header, size or entry that does not fit,
            naming ``where``, the list's offset and the field.
    """
    entries: list[SignatureEntry] = []
    off = 0
    while off < len(data):

        def bad(field: str, detail: str, at: int = off) -> MalformedError:
            return MalformedError(
                _STRUCT, f"{where}: list at offset {at}: {field} {detail}"
            )

        if off + _HEADER.size > len(data):
            raise bad("header", f"truncated ({len(data) - off} bytes left)")
        raw_type, list_size, header_size, sig_size = _HEADER.unpack_from(data, off)
        sig_type = uuid.UUID(bytes_le=raw_type)
        if list_size < _HEADER.size or list_size > len(data) - off:
            raise bad("SignatureListSize", f"{list_size} does not fit the data")
        body = list_size - _HEADER.size
        if header_size > body:
            raise bad("SignatureHeaderSize", f"{header_size} exceeds the list")
        if sig_size <= _OWNER:
            raise bad("SignatureSize", f"{sig_size} leaves no signature data")
        if sig_type == EFI_CERT_SHA256 and sig_size != _OWNER + 32:
            raise bad("SignatureSize", f"{sig_size} is not 48 for EFI_CERT_SHA256")
        if (body - header_size) % sig_size:
            raise bad(
                "SignatureListSize",
                f"{list_size} is not the header plus whole {sig_size}-byte entries",
            )
        start = off + _HEADER.size + header_size
        for pos in range(start, off + list_size, sig_size):
            if len(entries) >= _MAX_ENTRIES:
                raise bad("SignatureListSize", f"over {_MAX_ENTRIES} entries")
            owner = uuid.UUID(bytes_le=bytes(data[pos : pos + _OWNER]))
            value = bytes(data[pos + _OWNER : pos + sig_size])
            entries.append(SignatureEntry(sig_type, owner, value))
        off += list_size
    return tuple(entries)


def parse_signature_data(
    data: bytes, sig_type: uuid.UUID | None, where: str
) -> SignatureEntry:
    """Parse one ``EFI_SIGNATURE_DATA`` (an authority event's variable data).

    The structure does not carry its type: it is guessed from the data when
    ``sig_type`` is ``None`` (32 bytes of data: a SHA-256 digest; data that
    starts as a DER SEQUENCE: an X.509 certificate).

    Raises:
        MalformedError: shorter than an owner GUID plus one byte.
    """
    if len(data) <= _OWNER:
        raise MalformedError(
            "EFI_SIGNATURE_DATA", f"{where}: {len(data)} bytes, no signature data"
        )
    value = bytes(data[_OWNER:])
    if sig_type is None:
        sig_type = EFI_CERT_SHA256 if len(value) == 32 else EFI_CERT_X509
    return SignatureEntry(sig_type, uuid.UUID(bytes_le=bytes(data[:_OWNER])), value)


def signature_list(
    sig_type: uuid.UUID, owner: uuid.UUID, values: Iterable[bytes]
) -> bytes:
    """One ``EFI_SIGNATURE_LIST`` of same-size ``values`` (no header).

    Raises:
        ValueError: no values, or values of different sizes.
    """
    items = list(values)
    sizes = {len(v) for v in items}
    if len(sizes) != 1:
        raise ValueError("a signature list holds one or more same-size entries")
    sig_size = _OWNER + sizes.pop()
    out = bytearray(
        _HEADER.pack(
            sig_type.bytes_le, _HEADER.size + sig_size * len(items), 0, sig_size
        )
    )
    for value in items:
        out += owner.bytes_le + value
    return bytes(out)


def key_from_text(text: str, where: str) -> str:
    """A policy's spelling of an entry -> its key.

    Accepted: ``x509:<64 hex>``, ``sha256:<64 hex>``, ``<GUID>:<64 hex>``
    (lower or upper case), or a PEM certificate (its key is
    ``x509:`` + the sha256 of its DER).

    Raises:
        MalformedError: anything else, naming ``where``.
    """
    if not isinstance(text, str):
        raise MalformedError("measured-boot policy", f"{where}: must be a string")
    pem = _PEM.fullmatch(text.strip())
    if pem is not None:
        try:
            der = base64.b64decode("".join(pem.group(1).split()), validate=True)
        except (binascii.Error, ValueError):
            raise MalformedError(
                "measured-boot policy", f"{where}: PEM certificate is not base64"
            ) from None
        return "x509:" + _sha256(der).hex()
    kind, _, value = text.strip().lower().rpartition(":")
    if kind not in ("x509", "sha256"):
        try:
            kind = str(uuid.UUID(kind))
        except ValueError:
            kind = ""
    kind = {str(EFI_CERT_X509): "x509", str(EFI_CERT_SHA256): "sha256"}.get(kind, kind)
    if not kind or _HEX64.fullmatch(value) is None:
        raise MalformedError(
            "measured-boot policy",
            f"{where}: {text[:80]!r} is not x509:<sha256 hex>, sha256:<hex>, "
            "<type GUID>:<sha256 hex> or a PEM certificate",
        )
    return f"{kind}:{value}"
