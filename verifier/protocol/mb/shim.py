"""What shim carries built in, read from its PE file, and what it then logs:
the basis of a policy's ``mok`` and ``sbat_level`` for an image's shim.

shim keeps its vendor certificate and vendor revocations in the section
``.vendor_cert`` (a table of four little-endian ``UINT32``: authorized
size, deauthorized size, authorized offset, deauthorized offset, offsets
from the section's start; the authorized part is one DER certificate, the
deauthorized part a sequence of ``EFI_SIGNATURE_LIST``) and its SBAT
revocation levels in ``.sbatlevel`` (``UINT32`` version 0, then the offsets
of the *previous* and *latest* texts, counted from the end of the version
field, each NUL-terminated). Section names longer than eight bytes are
``/N``: offset N into the COFF string table.

At boot shim mirrors ``MokList`` (its vendor certificate as an
``EFI_CERT_X509`` list owned by shim, then the machine owner's keys),
``MokListX`` (its vendor revocations, then the owner's) and
``MokListTrusted`` (one byte, ``01`` unless the owner cleared it) into
boot-time variables and logs each in PCR 14 (an ``EV_IPL`` naming the
variable; the digest is the sha256 of the contents). A list with nothing
in it is a placeholder: one ``EFI_CERT_SHA256`` entry of zeros
(:func:`verifier.protocol.mb.chain.mok_empty`). With no ``SbatPolicy``
set, shim applies its *previous* SBAT level. Seen on Debian's shim 16.1
under OVMF: every digest :func:`mok_digests` gives matched the real log.

Pure: bytes in, values out; any malformed input raises
:class:`~verifier.protocol.errors.MalformedError`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct

from verifier.protocol.errors import MalformedError
from verifier.protocol.mb import efisig
from verifier.protocol.mb.chain import mok_empty

__all__ = ["ShimBuiltins", "mok_digests", "pe_sections", "shim_builtins"]

_STRUCT = "shim image"
_MAX_SECTIONS = 96


def _bad(detail: str) -> MalformedError:
    return MalformedError(_STRUCT, detail)


def _u16(data: bytes, offset: int) -> int:
    if offset < 0 or offset + 2 > len(data):
        raise _bad(f"truncated at byte {offset}")
    return int(struct.unpack_from("<H", data, offset)[0])


def _u32(data: bytes, offset: int) -> int:
    if offset < 0 or offset + 4 > len(data):
        raise _bad(f"truncated at byte {offset}")
    return int(struct.unpack_from("<I", data, offset)[0])


def _section_name(image: bytes, raw: bytes, strings: int | None) -> str:
    name = raw.rstrip(b"\0")
    if name.startswith(b"/") and name[1:].isdigit():
        if strings is None:
            raise _bad(f"long section name {name!r} without a string table")
        start = strings + int(name[1:])
        end = image.find(b"\0", start, start + 256)
        if start >= len(image) or end < 0:
            raise _bad(f"section name {name!r} points outside the string table")
        name = image[start:end]
    try:
        return name.decode("ascii")
    except UnicodeDecodeError:
        raise _bad(f"section name {name[:16]!r} is not ASCII") from None


def pe_sections(image: bytes) -> dict[str, bytes]:
    """The raw data of each section of a PE/COFF image, by name.

    Raises:
        MalformedError: not a PE image, or a header points outside it.
    """
    if len(image) < 0x40 or image[:2] != b"MZ":
        raise _bad("no MZ header")
    pe = _u32(image, 0x3C)
    if image[pe : pe + 4] != b"PE\0\0":
        raise _bad("no PE signature")
    count = _u16(image, pe + 6)
    if count > _MAX_SECTIONS:
        raise _bad(f"{count} sections (at most {_MAX_SECTIONS})")
    symbols, nsymbols = _u32(image, pe + 12), _u32(image, pe + 16)
    strings = symbols + 18 * nsymbols if symbols else None
    table = pe + 24 + _u16(image, pe + 20)
    out: dict[str, bytes] = {}
    for index in range(count):
        entry = table + 40 * index
        if entry + 40 > len(image):
            raise _bad("truncated section table")
        name = _section_name(image, image[entry : entry + 8], strings)
        virtual, raw_size = _u32(image, entry + 8), _u32(image, entry + 16)
        offset = _u32(image, entry + 20)
        size = min(virtual, raw_size) if virtual else raw_size
        if offset + size > len(image):
            raise _bad(f"section {name!r} beyond the end of the image")
        out.setdefault(name, image[offset : offset + size])
    return out


@dataclasses.dataclass(frozen=True)
class ShimBuiltins:
    """What a shim binary carries.

    Attributes:
        vendor_cert: its vendor certificate (DER), or None.
        vendor_dbx: its vendor revocations (``EFI_SIGNATURE_LIST`` bytes).
        sbat_previous: the *previous* SBAT level text, or None.
        sbat_latest: the *latest* SBAT level text, or None.
    """

    vendor_cert: bytes | None
    vendor_dbx: bytes
    sbat_previous: str | None
    sbat_latest: str | None


def _vendor(section: bytes) -> tuple[bytes | None, bytes]:
    auth_size, deauth_size = _u32(section, 0), _u32(section, 4)
    auth_off, deauth_off = _u32(section, 8), _u32(section, 12)
    if auth_off + auth_size > len(section) or deauth_off + deauth_size > len(section):
        raise _bad(".vendor_cert: a part lies beyond the section")
    cert = section[auth_off : auth_off + auth_size] or None
    dbx = section[deauth_off : deauth_off + deauth_size]
    if dbx:
        efisig.parse_signature_lists(dbx, ".vendor_cert deauthorized")
    return cert, dbx


def _sbat_text(section: bytes, offset: int, which: str) -> str:
    start = 4 + offset
    end = section.find(b"\0", start)
    if start > len(section) or end < 0:
        raise _bad(f".sbatlevel: the {which} level lies beyond the section")
    try:
        return section[start:end].decode("ascii")
    except UnicodeDecodeError:
        raise _bad(f".sbatlevel: the {which} level is not ASCII") from None


def shim_builtins(image: bytes) -> ShimBuiltins:
    """Read a shim binary's vendor certificate, revocations and SBAT levels.

    Raises:
        MalformedError: not a PE image, or a malformed section.
    """
    sections = pe_sections(image)
    cert, dbx = None, b""
    if ".vendor_cert" in sections:
        cert, dbx = _vendor(sections[".vendor_cert"])
    previous = latest = None
    level = sections.get(".sbatlevel")
    if level is not None:
        if _u32(level, 0) != 0:
            raise _bad(f".sbatlevel: unknown version {_u32(level, 0)}")
        previous = _sbat_text(level, _u32(level, 4), "previous")
        latest = _sbat_text(level, _u32(level, 8), "latest")
    return ShimBuiltins(cert, dbx, previous, latest)


def mok_digests(builtins: ShimBuiltins) -> dict[str, bytes]:
    """The sha256 digests shim logs in PCR 14 for ``MokList``, ``MokListX``
    and ``MokListTrusted`` when the machine owner enrolled nothing."""
    if builtins.vendor_cert:
        esl = efisig.signature_list(
            efisig.EFI_CERT_X509, efisig.SHIM_LOCK, [builtins.vendor_cert]
        )
        mok_list = hashlib.sha256(esl).digest()
    else:
        mok_list = mok_empty()
    dbx = builtins.vendor_dbx
    return {
        "MokList": mok_list,
        "MokListX": hashlib.sha256(dbx).digest() if dbx else mok_empty(),
        "MokListTrusted": hashlib.sha256(b"\x01").digest(),
    }
