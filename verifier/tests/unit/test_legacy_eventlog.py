"""Legacy and odd firmware event logs (issue 18): the TCG legacy SHA-1
format (no Spec ID Event03), logs holding only a StartupLocality event, the
``sm3_256`` bank, and errors that say which format was seen."""

from __future__ import annotations

import hashlib
import struct

import testtools

from node_agent.trial.eventlog import LegacyLogWriter, LogWriter
from verifier.protocol import EvidenceError, MalformedError
from verifier.protocol.evidence import check_measured_boot
from verifier.protocol.mb import eventlog as ev
from verifier.protocol.mb import parse, replay
from verifier.protocol.mb.replay import STARTUP_LOCALITY


def _extend(pcr: bytes, data: bytes, algorithm: str = "sha1") -> bytes:
    return hashlib.new(algorithm, pcr + hashlib.new(algorithm, data).digest()).digest()


def legacy_log() -> bytes:
    """What a TPM 2.0 firmware logging in the TCG 1.2 format writes."""
    log = LegacyLogWriter().add(0, ev.EV_S_CRTM_VERSION, "1.0".encode("utf-16-le"))
    for pcr in range(8):
        log.add(pcr, ev.EV_SEPARATOR, bytes(4))
    log.add(4, ev.EV_EFI_BOOT_SERVICES_APPLICATION, b"\x00" * 32, b"shim image")
    return log.build()


class LegacyFormatTest(testtools.TestCase):
    def test_legacy_sha1_log_is_parsed_not_refused(self) -> None:
        # Refused as "not a Spec ID event" before: could not be attested.
        log = parse(legacy_log())
        self.assertEqual(ev.LEGACY_SHA1, log.format)
        self.assertIsNone(log.spec_id)
        self.assertEqual(("sha1",), log.banks)
        self.assertEqual(10, len(log.events))
        self.assertEqual(ev.EV_S_CRTM_VERSION, log.events[0].event_type)
        self.assertEqual({"sha1"}, set(log.events[4].digests))

    def test_legacy_sha1_log_replays_the_sha1_bank(self) -> None:
        log = parse(legacy_log())
        pcrs = replay(log.events, banks=("sha1",))["sha1"]
        pcr0 = _extend(_extend(bytes(20), "1.0".encode("utf-16-le")), bytes(4))
        pcr4 = _extend(_extend(bytes(20), bytes(4)), b"shim image")
        self.assertEqual(pcr0, pcrs[0])
        self.assertEqual(pcr4, pcrs[4])

    def test_tpm12_spec_id_event00_header_is_a_legacy_log(self) -> None:
        header = b"Spec ID Event00\x00" + bytes(8)
        raw = LegacyLogWriter().add(0, ev.EV_NO_ACTION, header)
        raw.add(0, ev.EV_SEPARATOR, bytes(4))
        log = parse(raw.build())
        self.assertEqual(ev.LEGACY_SHA1, log.format)
        self.assertEqual(2, len(log.events))

    def test_legacy_log_with_zero_padding_is_accepted(self) -> None:
        log = parse(legacy_log() + bytes(4096))
        self.assertEqual(10, len(log.events))

    def test_truncated_legacy_log_names_the_format_and_event(self) -> None:
        raw = legacy_log()
        exc = self.assertRaises(MalformedError, parse, raw[:-5])
        self.assertIn("legacy SHA-1 log (no Spec ID Event03): event 9", exc.detail)

    def test_truncated_crypto_agile_log_names_the_format(self) -> None:
        raw = LogWriter().add(0, ev.EV_SEPARATOR, bytes(4)).build()
        exc = self.assertRaises(MalformedError, parse, raw[:-2])
        self.assertIn("crypto-agile log: event 1", exc.detail)

    def test_legacy_log_against_a_sha256_quote_says_which_format(self) -> None:
        quoted = {i: bytes(32) for i in range(10)}
        exc = self.assertRaises(
            EvidenceError, check_measured_boot, legacy_log(), quoted, None
        )
        self.assertEqual("mb_missing_digest", exc.reason)
        self.assertIn("legacy SHA-1 log", exc.detail)
        self.assertIn("sha256 bank", exc.detail)

    def test_tiny_input_names_its_size(self) -> None:
        exc = self.assertRaises(MalformedError, parse, b"\x00" * 7)
        self.assertIn("event 0: truncated header (7 bytes in all)", exc.detail)


class StartupLocalityOnlyTest(testtools.TestCase):
    def _log(self, locality: int) -> bytes:
        data = STARTUP_LOCALITY + bytes([locality])
        return LegacyLogWriter().add(0, ev.EV_NO_ACTION, data).build()

    def test_startup_locality_only_log_is_parsed(self) -> None:
        # Refused as "not a Spec ID event" before.
        log = parse(self._log(3))
        self.assertEqual(ev.LEGACY_SHA1, log.format)
        self.assertEqual(1, len(log.events))

    def test_startup_locality_only_log_is_attested_against_the_quote(self) -> None:
        quoted = {i: bytes(32) for i in range(10)}
        quoted[0] = bytes(31) + b"\x03"
        check_measured_boot(self._log(3), quoted, None)
        quoted[0] = bytes(32)
        exc = self.assertRaises(
            EvidenceError, check_measured_boot, self._log(3), quoted, None
        )
        self.assertEqual("mb_pcr_mismatch", exc.reason)


class Sm3Test(testtools.TestCase):
    def test_sm3_256_bank_is_named_and_replayed(self) -> None:
        raw = LogWriter(("sha256", "sm3_256")).add(0, ev.EV_SEPARATOR, bytes(4)).build()
        log = parse(raw)
        self.assertEqual(("sha256", "sm3_256"), log.banks)
        self.assertEqual({"sha256", "sm3_256"}, set(log.events[1].digests))
        pcrs = replay(log.events, banks=("sm3_256",))["sm3_256"]
        self.assertEqual(_extend(bytes(32), bytes(4), "sm3"), pcrs[0])

    def test_sm3_256_spec_id_entry_has_size_32(self) -> None:
        self.assertEqual(("sm3_256", 32), ev.ALGORITHMS[0x0012])
        self.assertEqual(struct.calcsize("<H"), 2)
