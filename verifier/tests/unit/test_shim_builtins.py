"""What shim carries built in (vendor certificate, vendor dbx, SBAT levels)
and the PCR 14 digests it logs when no machine owner key is enrolled."""

from __future__ import annotations

import hashlib
import struct

import testtools

from trusted_testing.secureboot_log import coff_image as _pe
from trusted_testing.secureboot_log import sbat_section as _sbatlevel
from trusted_testing.secureboot_log import vendor_cert_section as _vendor
from verifier.protocol import MalformedError
from verifier.protocol.mb import efisig
from verifier.protocol.mb.chain import mok_empty
from verifier.protocol.mb.shim import mok_digests, pe_sections, shim_builtins

_TABLE = 0x80 + 24

CERT = b"0\x82\x01\x00" + b"\x42" * 252
DBX = efisig.signature_list(efisig.EFI_CERT_SHA256, efisig.SHIM_LOCK, [b"\x01" * 32])
PREVIOUS = "sbat,1,2024010900\nshim,4\ngrub,3\n"
LATEST = "sbat,1,2024040900\nshim,4\ngrub,4\n"


class TestShimBuiltins(testtools.TestCase):
    def image(self) -> bytes:
        return _pe(
            [
                (b".text", b"\x90" * 64),
                (b".vendor_cert", _vendor(CERT, DBX)),
                (b".sbatlevel", _sbatlevel(PREVIOUS, LATEST)),
            ]
        )

    def test_long_section_names_come_from_the_string_table(self) -> None:
        names = set(pe_sections(self.image()))
        self.assertEqual({".text", ".vendor_cert", ".sbatlevel"}, names)

    def test_vendor_certificate_dbx_and_sbat_levels_are_read(self) -> None:
        builtins = shim_builtins(self.image())
        self.assertEqual(CERT, builtins.vendor_cert)
        self.assertEqual(DBX, builtins.vendor_dbx)
        self.assertEqual(
            (PREVIOUS, LATEST), (builtins.sbat_previous, builtins.sbat_latest)
        )

    def test_mok_digests_are_the_vendor_lists_shim_mirrors(self) -> None:
        digests = mok_digests(shim_builtins(self.image()))
        esl = efisig.signature_list(efisig.EFI_CERT_X509, efisig.SHIM_LOCK, [CERT])
        self.assertEqual(hashlib.sha256(esl).digest(), digests["MokList"])
        self.assertEqual(hashlib.sha256(DBX).digest(), digests["MokListX"])
        self.assertEqual(hashlib.sha256(b"\x01").digest(), digests["MokListTrusted"])

    def test_a_shim_without_vendor_lists_logs_placeholders(self) -> None:
        digests = mok_digests(shim_builtins(_pe([(b".text", b"\x90")])))
        self.assertEqual(mok_empty(), digests["MokList"])
        self.assertEqual(mok_empty(), digests["MokListX"])

    def test_a_vendor_part_beyond_its_section_is_refused(self) -> None:
        bad = struct.pack("<IIII", 4096, 0, 16, 16) + CERT
        image = _pe([(b".vendor_cert", bad)])
        self.assertRaises(MalformedError, shim_builtins, image)

    def test_a_long_name_outside_the_string_table_is_refused(self) -> None:
        image = bytearray(self.image())
        entry = _TABLE + 40
        image[entry : entry + 8] = b"/999999\0"
        self.assertRaises(MalformedError, pe_sections, bytes(image))

    def test_an_unknown_sbatlevel_version_is_refused(self) -> None:
        level = bytearray(_sbatlevel(PREVIOUS, LATEST))
        level[0] = 7
        self.assertRaises(
            MalformedError, shim_builtins, _pe([(b".sbatlevel", bytes(level))])
        )

    def test_truncated_images_raise_only_the_projects_error(self) -> None:
        image = self.image()
        for cut in range(0, len(image), 7):
            try:
                shim_builtins(image[:cut])
            except MalformedError:
                pass
