"""The Authenticode digest of a PE/COFF image: what UEFI firmware logs for
an ``EV_EFI_BOOT_SERVICES_APPLICATION`` it loads (a boot loader, a kernel's
EFI stub), so a measured-boot policy can be computed from the file.

Microsoft's "Windows Authenticode Portable Executable Signature Format",
section "Calculating the PE Image Hash", as EDK2's
``DxeTpm2MeasureBootLib`` (``Tcg2MeasurePeImage``) does it: the headers
without the checksum and the certificate table's directory entry, then the
sections' raw data in file order, then whatever follows the last section
except the attribute certificate table (the image's signatures).

Pure: bytes in, digest out.
"""

from __future__ import annotations

import hashlib
import struct

from verifier.protocol.errors import MalformedError

__all__ = ["pe_authenticode_digest"]

_STRUCT = "PE image"
_PE32, _PE32_PLUS = 0x10B, 0x20B
_CERT_DIRECTORY = 4


def _bad(detail: str) -> MalformedError:
    return MalformedError(_STRUCT, detail)


def _u16(data: bytes, offset: int) -> int:
    return int(struct.unpack_from("<H", data, offset)[0])


def _u32(data: bytes, offset: int) -> int:
    return int(struct.unpack_from("<I", data, offset)[0])


def _headers(image: bytes) -> tuple[int, int, int, int, int]:
    """(checksum offset, certificate entry offset, SizeOfHeaders, section
    table offset, number of sections)."""
    if len(image) < 0x40 or image[:2] != b"MZ":
        raise _bad("no MZ header")
    pe = _u32(image, 0x3C)
    if pe + 24 > len(image) or image[pe : pe + 4] != b"PE\0\0":
        raise _bad("no PE signature")
    sections = _u16(image, pe + 6)
    optional_size = _u16(image, pe + 20)
    optional = pe + 24
    magic = _u16(image, optional)
    if magic == _PE32:
        rva_count, directories = optional + 92, optional + 96
    elif magic == _PE32_PLUS:
        rva_count, directories = optional + 108, optional + 112
    else:
        raise _bad(f"unknown optional header magic {magic:#x}")
    if directories > len(image) or optional + optional_size > len(image):
        raise _bad("truncated optional header")
    if _u32(image, rva_count) <= _CERT_DIRECTORY:
        raise _bad("no certificate table directory entry")
    header_size = _u32(image, optional + 60)
    if header_size > len(image):
        raise _bad("SizeOfHeaders beyond the end of the image")
    return (
        optional + 64,
        directories + 8 * _CERT_DIRECTORY,
        header_size,
        optional + optional_size,
        sections,
    )


def pe_authenticode_digest(image: bytes, algorithm: str = "sha256") -> bytes:
    """The Authenticode digest of a PE/COFF image.

    Args:
        image: The whole file (e.g. a ``vmlinuz`` with its EFI stub).
        algorithm: A :mod:`hashlib` name.

    Returns:
        The digest firmware measures for the image.

    Raises:
        MalformedError: not a PE image, or a header points outside it.
    """
    checksum, cert_entry, header_size, table, count = _headers(image)
    digest = hashlib.new(algorithm)
    digest.update(image[:checksum])
    digest.update(image[checksum + 4 : cert_entry])
    digest.update(image[cert_entry + 8 : header_size])
    raw: list[tuple[int, int]] = []
    for index in range(count):
        entry = table + 40 * index
        if entry + 40 > len(image):
            raise _bad("truncated section table")
        size, offset = _u32(image, entry + 16), _u32(image, entry + 20)
        if size:
            if offset + size > len(image):
                raise _bad(f"section {index} beyond the end of the image")
            raw.append((offset, size))
    hashed = header_size
    for offset, size in sorted(raw):
        digest.update(image[offset : offset + size])
        hashed += size
    cert_size = _u32(image, cert_entry + 4)
    end = len(image) - cert_size
    if end < hashed:
        raise _bad("the certificate table overlaps the sections")
    digest.update(image[hashed:end])
    return digest.digest()
