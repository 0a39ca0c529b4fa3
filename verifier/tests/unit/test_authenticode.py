"""The Authenticode digest of a PE image (what OVMF logs for a kernel)."""

from __future__ import annotations

import hashlib
import struct

import testtools

from verifier.protocol import MalformedError
from verifier.protocol.mb.authenticode import pe_authenticode_digest

_PE = 0x80
_OPT = _PE + 24
_OPT_SIZE = 240  # PE32+: 112 bytes + 16 data directories
_TABLE = _OPT + _OPT_SIZE
_HEADERS = 0x200


def _image(cert: bytes = b"C" * 24, checksum: int = 0) -> tuple[bytes, bytes]:
    """A PE32+ image with two sections (listed out of file order), bytes
    after them and a certificate table; and its digest computed by hand."""
    sec_a, sec_b, tail = b"A" * 0x200, b"B" * 0x100, b"trailing data"
    off_a, off_b = _HEADERS + 0x100, _HEADERS
    end = off_a + len(sec_a)
    head = bytearray(_HEADERS)
    head[:2] = b"MZ"
    struct.pack_into("<I", head, 0x3C, _PE)
    head[_PE : _PE + 4] = b"PE\0\0"
    struct.pack_into("<HH", head, _PE + 4, 0x8664, 2)
    struct.pack_into("<H", head, _PE + 20, _OPT_SIZE)
    struct.pack_into("<H", head, _OPT, 0x20B)
    struct.pack_into("<I", head, _OPT + 60, _HEADERS)
    struct.pack_into("<I", head, _OPT + 64, checksum)
    struct.pack_into("<I", head, _OPT + 108, 16)
    cert_at = end + len(tail)
    struct.pack_into("<II", head, _OPT + 112 + 32, cert_at, len(cert))
    for i, (size, offset) in enumerate(((len(sec_a), off_a), (len(sec_b), off_b))):
        entry = _TABLE + 40 * i
        struct.pack_into("<II", head, entry + 16, size, offset)
    image = bytes(head) + sec_b + sec_a + tail + cert
    expected = hashlib.sha256(
        image[: _OPT + 64]
        + image[_OPT + 68 : _OPT + 144]
        + image[_OPT + 152 : _HEADERS]
        + sec_b
        + sec_a
        + tail
    ).digest()
    return image, expected


class TestAuthenticode(testtools.TestCase):
    def test_digest_skips_checksum_certificate_entry_and_table(self) -> None:
        image, expected = _image()
        self.assertEqual(expected, pe_authenticode_digest(image))

    def test_signing_does_not_change_the_digest(self) -> None:
        image, _ = _image()
        other, _ = _image(cert=b"another signature", checksum=0x1234)
        self.assertEqual(pe_authenticode_digest(image), pe_authenticode_digest(other))

    def test_a_changed_section_changes_the_digest(self) -> None:
        image, expected = _image()
        patched = bytearray(image)
        patched[_HEADERS + 5] ^= 1
        self.assertNotEqual(expected, pe_authenticode_digest(bytes(patched)))

    def test_not_a_pe_image_is_refused(self) -> None:
        for bad in (b"", b"MZ" + bytes(100), b"\x7fELF" + bytes(200)):
            self.assertRaises(MalformedError, pe_authenticode_digest, bad)

    def test_truncated_image_is_refused(self) -> None:
        image, _ = _image()
        self.assertRaises(MalformedError, pe_authenticode_digest, image[:0x300])
