"""The event-log core against the TCG PC Client Platform Firmware Profile
(issue 32, item 4): one named test per rule, each failing on the code
before it.

* events extended into no PCR (PCRIndex 0xFFFFFFFF) are parsed, never
  replayed;
* PCR 0 starts from the H-CRTM value (00..04) after an H-CRTM event or a
  StartupLocality of 4, and contradictory start records are refused;
* the format is told by the Spec ID signature, not by the PCR of the first
  event (a TDX CCEL log), and errors name the format seen, the event and
  the field;
* IMA's sha1 boot_aggregate covers PCRs 0-7 of the sha1 bank, any other
  bank's PCRs 0-9 (Linux >= 5.8).

The same start values on a real swtpm: test_eventlog_swtpm (functional).
"""

from __future__ import annotations

import hashlib
import struct

import testtools

from node_agent.trial.eventlog import (
    LegacyLogWriter,
    LogWriter,
    efi_variable_data,
    spec_id_data,
)
from node_agent.trial.ima import boot_aggregate_entry, make_entry
from verifier.protocol import EvidenceError, MalformedError, ima
from verifier.protocol.evidence import check_measured_boot
from verifier.protocol.mb import eventlog as ev
from verifier.protocol.mb import parse, replay, startup_locality
from verifier.protocol.mb.policy import EFI_GLOBAL_VARIABLE
from verifier.protocol.mb.replay import STARTUP_LOCALITY

HCRTM_DATA = b"HCRTM"
CRTM_VERSION = "1.0".encode("utf-16-le") + b"\0\0"


def _h(bank: str, data: bytes) -> bytes:
    return hashlib.new(bank, data).digest()


def _pcr(bank: str, start: bytes, *measured: bytes) -> bytes:
    """A PCR extended with H(m) for each m, from ``start`` (textbook)."""
    value = start
    for m in measured:
        value = _h(bank, value + _h(bank, m))
    return value


def _start(bank: str, locality: int) -> bytes:
    size = hashlib.new(bank).digest_size
    return bytes(size - 1) + bytes([locality])


def _hcrtm_log(locality: int | None = None, hcrtm_first: bool = True) -> LogWriter:
    log = LogWriter()
    if locality is not None:
        log.add(0, ev.EV_NO_ACTION, STARTUP_LOCALITY + bytes([locality]))
    if hcrtm_first:
        log.add(0, ev.EV_EFI_HCRTM_EVENT, HCRTM_DATA)
    log.add(0, ev.EV_S_CRTM_VERSION, CRTM_VERSION)
    if not hcrtm_first:
        log.add(0, ev.EV_EFI_HCRTM_EVENT, HCRTM_DATA)
    return log.add(0, ev.EV_SEPARATOR, bytes(4))


class NotExtendedEventTest(testtools.TestCase):
    """PFP 10.4.5 / 10.2.2: an event logged with PCRIndex 0xFFFFFFFF is
    extended into no PCR."""

    def _log(self, with_not_extended: bool) -> bytes:
        log = LogWriter().add(0, ev.EV_S_CRTM_VERSION, CRTM_VERSION)
        if with_not_extended:
            # an EV_NO_ACTION variant and a platform's informational event
            log.add(ev.NOT_EXTENDED, ev.EV_NO_ACTION, b"NvIndexInstance\0" + bytes(8))
            log.add(ev.NOT_EXTENDED, ev.EV_EFI_ACTION, b"platform note")
        log.add(0, ev.EV_SEPARATOR, bytes(4))
        log.add(4, ev.EV_EFI_BOOT_SERVICES_APPLICATION, bytes(32), b"shim")
        return log.build()

    def test_event_in_pcr_ffffffff_is_parsed_and_never_replayed(self) -> None:
        log = parse(self._log(True))  # refused as "bad PCR index" before
        self.assertEqual(ev.CRYPTO_AGILE, log.format)
        self.assertEqual(ev.NOT_EXTENDED, log.events[2].pcr)
        self.assertFalse(log.events[2].extended)
        self.assertFalse(log.events[3].extended)  # not EV_NO_ACTION either
        self.assertTrue(log.events[4].extended)
        self.assertEqual(replay(parse(self._log(False)).events), replay(log.events))
        quoted = {i: bytes(32) for i in range(10)}
        quoted[0] = _pcr("sha256", bytes(32), CRTM_VERSION, bytes(4))
        quoted[4] = _pcr("sha256", bytes(32), b"shim")
        check_measured_boot(self._log(True), quoted, None)

    def test_legacy_event_in_pcr_ffffffff_is_not_replayed(self) -> None:
        raw = LegacyLogWriter().add(0, ev.EV_SEPARATOR, bytes(4))
        raw.add(ev.NOT_EXTENDED, ev.EV_EFI_ACTION, b"platform note")
        log = parse(raw.build())
        self.assertEqual(ev.LEGACY_SHA1, log.format)
        got = replay(log.events, banks=("sha1",))["sha1"]
        self.assertEqual({0: _pcr("sha1", bytes(20), bytes(4))}, got)

    def test_other_pcr_index_above_31_is_refused_naming_the_field(self) -> None:
        raw = LogWriter().add(32, ev.EV_EFI_ACTION, b"x").build()
        exc = self.assertRaises(MalformedError, parse, raw)
        self.assertIn(
            "crypto-agile log: event 1: PCRIndex: 0x20 is not a PCR", exc.detail
        )


class HcrtmStartTest(testtools.TestCase):
    """TPM 2.0 Part 1 (PCR initialization) and PFP 10.4.5.3: after an H-CRTM
    sequence PCR 0 is reset to 00..04 and extended with the H-CRTM digest
    (logged as EV_EFI_HCRTM_EVENT); TPM2_Startup from locality 3 starts it
    at 00..03."""

    def test_hcrtm_event_starts_pcr0_at_locality_4(self) -> None:
        log = parse(_hcrtm_log().build())
        self.assertEqual(4, startup_locality(log.events))
        got = replay(log.events)
        for bank in ("sha1", "sha256"):
            want = _pcr(bank, _start(bank, 4), HCRTM_DATA, CRTM_VERSION, bytes(4))
            self.assertEqual(want, got[bank][0])

    def test_startup_locality_4_with_hcrtm_event_is_the_same_start(self) -> None:
        plain = replay(parse(_hcrtm_log().build()).events)
        declared = replay(parse(_hcrtm_log(locality=4).build()).events)
        self.assertEqual(plain, declared)

    def test_startup_locality_4_without_hcrtm_event_starts_at_4(self) -> None:
        raw = LogWriter().add(0, ev.EV_NO_ACTION, STARTUP_LOCALITY + b"\x04")
        raw.add(0, ev.EV_SEPARATOR, bytes(4))
        got = replay(parse(raw.build()).events, banks=("sha256",))["sha256"]
        self.assertEqual(_pcr("sha256", _start("sha256", 4), bytes(4)), got[0])

    def test_hcrtm_log_is_judged_against_its_quote(self) -> None:
        quoted = {i: bytes(32) for i in range(10)}
        quoted[0] = _pcr(
            "sha256", _start("sha256", 4), HCRTM_DATA, CRTM_VERSION, bytes(4)
        )
        check_measured_boot(_hcrtm_log().build(), quoted, None)

    def test_startup_locality_3_with_hcrtm_event_is_refused(self) -> None:
        events = parse(_hcrtm_log(locality=3).build()).events
        exc = self.assertRaises(MalformedError, replay, events)
        self.assertIn("event 1 (EV_NO_ACTION): StartupLocality: locality 3", exc.detail)
        self.assertIn("event 2 is an H-CRTM measurement", exc.detail)

    def test_hcrtm_event_after_another_pcr0_measurement_is_refused(self) -> None:
        events = parse(_hcrtm_log(hcrtm_first=False).build()).events
        exc = self.assertRaises(MalformedError, replay, events)
        self.assertIn("event 2 (EV_EFI_HCRTM_EVENT): EventType:", exc.detail)
        self.assertIn("event 1 extended PCR 0 before it", exc.detail)

    def test_startup_locality_other_than_0_3_4_is_refused(self) -> None:
        for locality in (1, 2, 5, 255):
            raw = LogWriter().add(
                0, ev.EV_NO_ACTION, STARTUP_LOCALITY + bytes([locality])
            )
            events = parse(raw.build()).events
            exc = self.assertRaises(MalformedError, replay, events)
            self.assertIn(
                f"event 1 (EV_NO_ACTION): StartupLocality: locality {locality} "
                "is not 0, 3 or 4",
                exc.detail,
            )

    def test_second_or_malformed_startup_locality_is_refused(self) -> None:
        twice = LogWriter()
        for _ in range(2):
            twice.add(0, ev.EV_NO_ACTION, STARTUP_LOCALITY + b"\x03")
        exc = self.assertRaises(MalformedError, replay, parse(twice.build()).events)
        self.assertIn("event 2 (EV_NO_ACTION): StartupLocality: a second", exc.detail)
        long = LogWriter().add(0, ev.EV_NO_ACTION, STARTUP_LOCALITY + b"\x03\x00")
        exc = self.assertRaises(MalformedError, replay, parse(long.build()).events)
        self.assertIn("StartupLocality: 18 bytes", exc.detail)
        moved = LogWriter().add(2, ev.EV_NO_ACTION, STARTUP_LOCALITY + b"\x03")
        exc = self.assertRaises(MalformedError, replay, parse(moved.build()).events)
        self.assertIn("event 1 (EV_NO_ACTION): PCRIndex: 0x2", exc.detail)


class FormatDetectionTest(testtools.TestCase):
    """PFP 10.4.5.1: a crypto-agile log starts with the Spec ID Event03;
    the signature tells the format, not the first event's PCRIndex."""

    def test_spec_id_event_outside_pcr0_is_a_crypto_agile_log(self) -> None:
        # A TDX CCEL log: register 1 (RTMR[0]) in place of a TPM's PCR 0.
        for pcr in (1, ev.NOT_EXTENDED):
            raw = LogWriter(("sha384",), spec_id_pcr=pcr)
            raw.add(1, ev.EV_EFI_ACTION, b"Calling EFI Application")
            log = parse(raw.build())  # "legacy SHA-1" and refused before
            self.assertEqual(ev.CRYPTO_AGILE, log.format)
            self.assertEqual(("sha384",), log.banks)
            self.assertEqual(pcr, log.events[0].pcr)
            self.assertEqual(
                _h("sha384", bytes(48) + _h("sha384", b"Calling EFI Application")),
                replay(log.events, banks=("sha384",))["sha384"][1],
            )

    def test_broken_spec_id_event_is_reported_as_crypto_agile(self) -> None:
        spec = bytearray(spec_id_data(("sha256",)))
        struct.pack_into("<I", spec, 24, 0)  # numberOfAlgorithms
        raw = struct.pack("<II20sI", 1, ev.EV_NO_ACTION, bytes(20), len(spec)) + spec
        exc = self.assertRaises(MalformedError, parse, raw)
        self.assertIn(
            "crypto-agile log: event 0 (Spec ID Event03): numberOfAlgorithms: 0",
            exc.detail,
        )

    def test_spec_id_event_of_another_type_is_refused(self) -> None:
        spec = spec_id_data(("sha256",))
        raw = struct.pack("<II20sI", 0, ev.EV_SEPARATOR, bytes(20), len(spec)) + spec
        exc = self.assertRaises(MalformedError, parse, raw)
        self.assertIn(
            "crypto-agile log: event 0 (Spec ID Event03): EventType: EV_SEPARATOR",
            exc.detail,
        )


class ErrorsNameEventAndFieldTest(testtools.TestCase):
    """Every parser error names the format, the event index and the field."""

    def _agile(self) -> tuple[bytearray, int]:
        raw = bytearray(
            LogWriter(("sha256",)).add(0, ev.EV_SEPARATOR, bytes(4)).build()
        )
        return raw, 32 + struct.unpack_from("<I", raw, 28)[0]

    def test_crypto_agile_fields(self) -> None:
        agile = "crypto-agile log: event 1: "
        raw, off = self._agile()
        cases = {}
        bad = bytearray(raw)
        struct.pack_into("<I", bad, off + 8, 17)
        cases["digests.count: 17 is more than 16"] = bad
        bad = bytearray(raw)
        struct.pack_into("<H", bad, off + 12, 0x4)
        cases["digests[0].hashAlg: 0x0004 is not declared"] = bad
        bad = bytearray(raw)
        struct.pack_into("<I", bad, off + 12 + 2 + 32, 99)
        cases["EventSize: 99 exceeds the log (4 bytes left)"] = bad
        cases["digests[0].digest: truncated (10 of 32 bytes)"] = raw[: off + 24]
        cases["EventType: truncated (2 of 4 bytes)"] = raw[: off + 6]
        cases["EventSize: truncated (2 of 4 bytes)"] = raw[: off + 48]
        for expected, data in cases.items():
            exc = self.assertRaises(MalformedError, parse, bytes(data))
            self.assertIn(agile + expected, exc.detail)

    def test_spec_id_fields(self) -> None:
        spec = bytearray(spec_id_data(("sha256",)))
        struct.pack_into("<H", spec, 30, 20)
        raw = struct.pack("<II20sI", 0, ev.EV_NO_ACTION, bytes(20), len(spec)) + spec
        exc = self.assertRaises(MalformedError, parse, raw)
        self.assertIn(
            "event 0 (Spec ID Event03): digestSizes[0]: digestSize 20 is wrong",
            exc.detail,
        )
        spec = spec_id_data(("sha256",)) + b"\0"
        raw = struct.pack("<II20sI", 0, ev.EV_NO_ACTION, bytes(20), len(spec)) + spec
        exc = self.assertRaises(MalformedError, parse, raw)
        self.assertIn("event 0 (Spec ID Event03): vendorInfoSize: 0", exc.detail)

    def test_legacy_fields(self) -> None:
        legacy = "legacy SHA-1 log (no Spec ID Event03): event 1: "
        raw = LegacyLogWriter().add(0, ev.EV_SEPARATOR, bytes(4))
        raw.add(40, ev.EV_SEPARATOR, bytes(4))
        exc = self.assertRaises(MalformedError, parse, raw.build())
        self.assertIn(legacy + "PCRIndex: 0x28", exc.detail)
        one = LegacyLogWriter().add(0, ev.EV_SEPARATOR, bytes(4)).build()
        exc = self.assertRaises(MalformedError, parse, one + one[:20])
        self.assertIn(legacy + "digest: truncated (12 of 20 bytes)", exc.detail)

    def test_efi_variable_fields(self) -> None:
        data = efi_variable_data(EFI_GLOBAL_VARIABLE, "SecureBoot", b"\x01")
        raw = LogWriter().add(7, ev.EV_EFI_VARIABLE_DRIVER_CONFIG, data[:-1]).build()
        event = parse(raw).events[1]
        exc = self.assertRaises(MalformedError, lambda: event.variable)
        self.assertIn(
            "event 1: UnicodeNameLength 10 and VariableDataLength 1", exc.detail
        )


class BootAggregateRuleTest(testtools.TestCase):
    """Linux >= 5.8, ima_calc_boot_aggregate_tfm: PCRs 0-7 of the bank, and
    PCRs 8-9 only when the bank is not sha1."""

    @staticmethod
    def _bank(bank: str) -> list[bytes]:
        # PCRs 8 and 9 (GRUB's commands, the kernel) are not zero
        return [_h(bank, bytes([i])) for i in range(10)]

    def test_sha1_boot_aggregate_covers_pcrs_0_to_7(self) -> None:
        pcrs = self._bank("sha1")
        want = hashlib.sha1(b"".join(pcrs[:8])).digest()
        self.assertEqual(want, ima.boot_aggregate(pcrs, "sha1"))
        self.assertEqual(want, ima.boot_aggregate(pcrs[:8], "sha1"))
        entry = boot_aggregate_entry(pcrs, algorithm="sha1")
        self.assertEqual(want, entry.digest)
        ima.check_boot_aggregate(entry, pcrs, bank="sha1")
        # the pre-5.8 reading (0-9) of a sha1 aggregate is refused
        wrong = make_entry(
            "boot_aggregate",
            algorithm="sha1",
            digest=hashlib.sha1(b"".join(pcrs)).digest(),
        )
        exc = self.assertRaises(
            EvidenceError, ima.check_boot_aggregate, wrong, pcrs, bank="sha1"
        )
        self.assertIn(
            "sha1 boot_aggregate does not match the quoted PCRs 0-7", exc.detail
        )

    def test_sha256_boot_aggregate_covers_pcrs_0_to_9(self) -> None:
        pcrs = self._bank("sha256")
        want = hashlib.sha256(b"".join(pcrs)).digest()
        self.assertEqual(want, ima.boot_aggregate(pcrs, "sha256"))
        entry = boot_aggregate_entry(pcrs)
        ima.check_boot_aggregate(entry, pcrs)
        pcrs[9] = bytes(32)  # the kernel changed: the aggregate must not match
        exc = self.assertRaises(EvidenceError, ima.check_boot_aggregate, entry, pcrs)
        self.assertIn(
            "sha256 boot_aggregate does not match the quoted PCRs 0-9", exc.detail
        )

    def test_sha1_boot_aggregate_against_a_sha256_quote_names_the_bank(self) -> None:
        entry = boot_aggregate_entry(self._bank("sha1"), algorithm="sha1")
        exc = self.assertRaises(
            EvidenceError, ima.check_boot_aggregate, entry, self._bank("sha256")
        )
        self.assertEqual("ima_boot_aggregate", exc.reason)
        self.assertIn(
            "boot_aggregate is sha1 (over the sha1 bank's PCRs 0-7), the quote "
            "covers the sha256 bank",
            exc.detail,
        )
