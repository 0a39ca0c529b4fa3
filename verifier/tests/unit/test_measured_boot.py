"""Measured boot: TCG crypto-agile event log parsing, PCR replay, policies
and a cross-check against ``tpm2_eventlog``."""

import hashlib
import os
import re
import shutil
import struct
import subprocess
import tempfile
import uuid

import testtools
from hypothesis import given, settings
from hypothesis import strategies as st

from node_agent.trial.eventlog import (
    LogWriter,
    efi_variable_data,
    sample_log,
    spec_id_data,
)
from verifier.protocol import EvidenceError, MalformedError
from verifier.protocol.mb import (
    MeasuredBootPolicy,
    check,
    check_against_pcrs,
    evaluate,
    parse,
    parse_efi_variable,
    replay,
    secure_boot_state,
    startup_locality,
)
from verifier.protocol.mb import eventlog as ev
from verifier.protocol.mb.policy import EFI_GLOBAL_VARIABLE, policy_from_log
from verifier.protocol.mb.replay import STARTUP_LOCALITY

BOOTLOADER = b"grubx64.efi image"
KERNEL = b"vmlinuz image"


def sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def independent_replay(
    raw_events: list[tuple[int, int, bytes]], bank: str, locality: int = 0
) -> dict[int, bytes]:
    """Replay (pcr, type, digest) triples the textbook way."""
    size = hashlib.new(bank).digest_size
    pcrs: dict[int, bytes] = {}
    if locality:
        pcrs[0] = b"\0" * (size - 1) + bytes([locality])
    for pcr, etype, digest in raw_events:
        if etype == 3:
            continue
        pcrs[pcr] = hashlib.new(bank, pcrs.get(pcr, b"\0" * size) + digest).digest()
    return pcrs


class ParseTest(testtools.TestCase):
    def test_spec_id_event(self) -> None:
        log = parse(sample_log())
        self.assertEqual((2, 0, 0), log.spec_id.spec_version)
        self.assertEqual({0x4: 20, 0xB: 32}, log.spec_id.digest_sizes)
        self.assertEqual(("sha1", "sha256"), log.banks)
        self.assertEqual(2, log.spec_id.uintn_size)
        first = log.events[0]
        self.assertEqual(
            (0, 0, "EV_NO_ACTION"), (first.index, first.pcr, first.type_name)
        )

    def test_round_trip(self) -> None:
        log = parse(sample_log())
        self.assertEqual(14, len(log.events))
        self.assertEqual(list(range(14)), [e.index for e in log.events])
        loc = log.events[1]
        self.assertEqual("EV_NO_ACTION", loc.type_name)
        self.assertEqual(STARTUP_LOCALITY + b"\x03", loc.data)
        self.assertEqual(bytes(32), loc.digests["sha256"])
        crtm = log.events[2]
        self.assertEqual("EV_S_CRTM_VERSION", crtm.type_name)
        self.assertEqual(sha256(crtm.data), crtm.digests["sha256"])
        seps = [e for e in log.events if e.event_type == ev.EV_SEPARATOR]
        self.assertEqual(list(range(8)), [e.pcr for e in seps])
        apps = [
            e for e in log.events if e.type_name == "EV_EFI_BOOT_SERVICES_APPLICATION"
        ]
        self.assertEqual(
            [sha256(BOOTLOADER), sha256(KERNEL)], [a.digests["sha256"] for a in apps]
        )
        self.assertEqual(hashlib.sha1(KERNEL).digest(), apps[1].digests["sha1"])
        self.assertIsNone(apps[0].variable)

    def test_efi_variable(self) -> None:
        log = parse(sample_log())
        var = log.events[3].variable
        assert var is not None
        self.assertEqual(EFI_GLOBAL_VARIABLE, var.guid)
        self.assertEqual("SecureBoot", var.name)
        self.assertEqual(b"\x01", var.data)
        data = efi_variable_data(uuid.UUID(int=5), "Boot0001", b"\x01\x02\x03")
        self.assertEqual(
            ev.EfiVariable(uuid.UUID(int=5), "Boot0001", b"\x01\x02\x03"),
            parse_efi_variable(data),
        )

    def test_efi_variable_malformed(self) -> None:
        data = efi_variable_data(EFI_GLOBAL_VARIABLE, "SecureBoot", b"\x01")
        for bad in (data[:-1], data + b"\0", data[:20]):
            self.assertRaises(MalformedError, parse_efi_variable, bad)
        event = parse(self._log_with_var(data[:-1])).events[1]
        e = self.assertRaises(MalformedError, lambda: event.variable)
        self.assertIn("event 1", e.detail)

    @staticmethod
    def _log_with_var(data: bytes) -> bytes:
        return LogWriter().add(7, ev.EV_EFI_VARIABLE_DRIVER_CONFIG, data).build()

    def test_event_type_names(self) -> None:
        self.assertEqual("EV_EFI_VARIABLE_AUTHORITY", ev.event_type_name(0x800000E0))
        self.assertEqual("EV_IPL", ev.event_type_name(0xD))
        self.assertEqual(
            "EV_EFI_PLATFORM_FIRMWARE_BLOB2", ev.event_type_name(0x8000000A)
        )
        self.assertEqual("EV_UNKNOWN_0x1234", ev.event_type_name(0x1234))

    def test_sha256_only_and_sha384(self) -> None:
        raw = LogWriter(("sha256", "sha384")).add(4, ev.EV_EFI_ACTION, b"x").build()
        event = parse(raw).events[1]
        self.assertEqual({"sha256", "sha384"}, set(event.digests))
        self.assertEqual(48, len(event.digests["sha384"]))

    def test_trailing_zero_padding_ignored(self) -> None:
        self.assertEqual(parse(sample_log()), parse(sample_log() + bytes(64)))

    def test_truncation_at_every_offset(self) -> None:
        raw = sample_log()
        boundaries = set()
        off = 32 + struct.unpack_from("<I", raw, 28)[0]
        boundaries.add(off)
        for event in parse(raw).events[1:]:
            off += (
                12
                + sum(2 + len(d) for d in event.digests.values())
                + 4
                + len(event.data)
            )
            boundaries.add(off)
        self.assertEqual(len(raw), off)
        for cut in range(len(raw)):
            if cut in boundaries:
                self.assertLess(len(parse(raw[:cut]).events), 14)
                continue
            try:
                log = parse(raw[:cut])
            except MalformedError as exc:
                # the format seen, then the event (issue 18)
                self.assertRegex(
                    exc.detail,
                    r"^((crypto-agile log|legacy SHA-1 log \(no Spec ID Event03\)):"
                    r" )?event \d+",
                )
            else:  # only zero bytes of a PCR 0 header were cut off
                self.assertFalse(any(raw[max(boundaries & set(range(cut))) : cut]))
                self.assertLess(len(log.events), 14)

    def test_malformed_details(self) -> None:
        raw = sample_log()
        e = self.assertRaises(MalformedError, parse, raw[:-1])
        self.assertEqual("TCG event log", e.structure)
        self.assertIn("event 13", e.detail)
        e = self.assertRaises(MalformedError, parse, b"")
        self.assertIn("event 0", e.detail)
        # Not crypto-agile: a legacy SHA-1 log with no Spec ID event is
        # parsed as one (issue 18), and says so when it is truncated.
        legacy = struct.pack("<II20sI", 0, 8, bytes(20), 4) + b"abcd"
        self.assertEqual(ev.LEGACY_SHA1, parse(legacy).format)
        e = self.assertRaises(MalformedError, parse, legacy[:-1])
        self.assertIn("legacy SHA-1 log (no Spec ID Event03): event 0", e.detail)
        # An algorithm the Spec ID event did not declare.
        bad = bytearray(LogWriter(("sha256",)).add(0, 8, b"v").build())
        spec_len = 32 + struct.unpack_from("<I", bad, 28)[0]
        struct.pack_into("<H", bad, spec_len + 12, 0x4)
        e = self.assertRaises(MalformedError, parse, bytes(bad))
        self.assertIn("event 1", e.detail)
        # Wrong digest size for a known algorithm in the Spec ID event.
        spec = bytearray(spec_id_data(("sha256",)))
        struct.pack_into("<H", spec, 30, 20)
        raw = struct.pack("<II20sI", 0, 3, bytes(20), len(spec)) + spec
        self.assertRaises(MalformedError, parse, raw)

    @settings(max_examples=150, deadline=None)
    @given(st.data())
    def test_garbage_raises_only_malformed(self, data: st.DataObject) -> None:
        raw = bytearray(sample_log())
        for _ in range(data.draw(st.integers(1, 4))):
            pos = data.draw(st.integers(0, len(raw) - 1))
            raw[pos] = data.draw(st.integers(0, 255))
        try:
            log = parse(bytes(raw))
        except MalformedError:
            return
        try:
            replay(log.events)
            evaluate(MeasuredBootPolicy(secure_boot=True), log.events)
        except (MalformedError, EvidenceError):
            pass


class ReplayTest(testtools.TestCase):
    def test_matches_independent_computation(self) -> None:
        log = parse(sample_log())
        triples = {
            bank: [(e.pcr, e.event_type, e.digests[bank]) for e in log.events[1:]]
            for bank in ("sha1", "sha256")
        }
        got = replay(log.events)
        for bank in ("sha1", "sha256"):
            self.assertEqual(independent_replay(triples[bank], bank, 3), got[bank])
        self.assertEqual(set(range(8)), set(got["sha256"]))

    def test_no_action_not_extended(self) -> None:
        base = LogWriter().add(4, ev.EV_EFI_ACTION, b"a")
        with_na = LogWriter().add(4, ev.EV_EFI_ACTION, b"a")
        with_na.add(
            4,
            ev.EV_NO_ACTION,
            b"ignored",
            digests={"sha1": b"\1" * 20, "sha256": b"\1" * 32},
        )
        self.assertEqual(
            replay(parse(base.build()).events), replay(parse(with_na.build()).events)
        )

    def test_startup_locality(self) -> None:
        log3 = parse(sample_log(locality=3))
        log0 = parse(sample_log(locality=None))
        self.assertEqual(3, startup_locality(log3.events))
        self.assertEqual(0, startup_locality(log0.events))
        r3, r0 = replay(log3.events), replay(log0.events)
        crtm = log0.events[1].digests["sha256"]
        sep = sha256(b"\0\0\0\0")
        expected = sha256(sha256(bytes(31) + b"\x03" + crtm) + sep)
        self.assertEqual(expected, r3["sha256"][0])
        self.assertNotEqual(r0["sha256"][0], r3["sha256"][0])
        self.assertEqual(r0["sha256"][4], r3["sha256"][4])

    def test_pcr_selection_and_missing_digest(self) -> None:
        raw = (
            LogWriter().add(12, ev.EV_IPL, b"grub cmd").add(9, ev.EV_IPL, b"x").build()
        )
        got = replay(parse(raw).events, banks=("sha256",))
        self.assertEqual({9}, set(got["sha256"]))
        raw = (
            LogWriter()
            .add(5, ev.EV_EFI_GPT_EVENT, b"g", digests={"sha256": sha256(b"g")})
            .build()
        )
        e = self.assertRaises(EvidenceError, replay, parse(raw).events)
        self.assertEqual("mb_missing_digest", e.reason)
        self.assertIn("event 1", e.detail)
        self.assertRaises(ValueError, replay, [], banks=("md5",))

    def test_check_against_pcrs(self) -> None:
        replayed = replay(parse(sample_log()).events)["sha256"]
        check_against_pcrs(replayed, dict(replayed))
        check_against_pcrs(replayed, {4: replayed[4], 9: bytes(32)})
        bad = dict(replayed)
        bad[7] = bytes(32)
        e = self.assertRaises(EvidenceError, check_against_pcrs, replayed, bad)
        self.assertEqual("mb_pcr_mismatch", e.reason)
        self.assertIn("PCR 7", e.detail)
        e = self.assertRaises(
            EvidenceError, check_against_pcrs, replayed, {8: b"\1" * 32}
        )
        self.assertIn("PCR 8", e.detail)


class PolicyTest(testtools.TestCase):
    def policy(self, **kw: object) -> MeasuredBootPolicy:
        doc = {
            "boot_applications": [sha256(BOOTLOADER).hex(), sha256(KERNEL).hex()],
            "firmware": [sha256("1.0".encode("utf-16-le") + b"\0\0").hex()],
            "secure_boot": True,
        }
        doc.update(kw)
        return MeasuredBootPolicy.from_dict(doc)

    def test_pass(self) -> None:
        events = parse(sample_log()).events
        self.assertEqual([], evaluate(self.policy(), events))
        check(self.policy(), events)
        check(MeasuredBootPolicy(), events)

    def test_policy_from_a_known_good_log_passes_it_and_refuses_others(self) -> None:
        good = parse(sample_log()).events
        policy = policy_from_log(good)
        self.assertEqual(self.policy(), policy)
        self.assertEqual([], evaluate(policy, good))
        for other in (
            sample_log(bootloader=b"evil grub"),
            sample_log(kernel=b"another kernel"),
            sample_log(secure_boot=False),
        ):
            self.assertEqual(1, len(evaluate(policy, parse(other).events)))

    def test_policy_from_a_log_without_those_events_checks_nothing_of_them(
        self,
    ) -> None:
        self.assertEqual(MeasuredBootPolicy(), policy_from_log(()))

    def test_wrong_bootloader(self) -> None:
        events = parse(sample_log(bootloader=b"evil grub")).events
        failures = evaluate(self.policy(), events)
        self.assertEqual(1, len(failures))
        self.assertEqual(
            (12, "EV_EFI_BOOT_SERVICES_APPLICATION"),
            (failures[0].index, failures[0].event_type),
        )
        self.assertIn(sha256(b"evil grub").hex(), failures[0].reason)
        e = self.assertRaises(EvidenceError, check, self.policy(), events)
        self.assertEqual("mb_policy", e.reason)
        self.assertIn("event 12", e.detail)

    def test_wrong_firmware(self) -> None:
        failures = evaluate(self.policy(firmware=[]), parse(sample_log()).events)
        self.assertEqual(
            [(2, "EV_S_CRTM_VERSION")], [(f.index, f.event_type) for f in failures]
        )

    def test_secure_boot_off_when_required(self) -> None:
        events = parse(sample_log(secure_boot=False)).events
        self.assertEqual((events[3], False), secure_boot_state(events))
        failures = evaluate(self.policy(), events)
        self.assertEqual(1, len(failures))
        self.assertEqual(3, failures[0].index)
        self.assertIn("disabled", failures[0].reason)
        self.assertEqual([], evaluate(self.policy(secure_boot=False), events))
        self.assertEqual([], evaluate(self.policy(secure_boot=None), events))
        on = parse(sample_log()).events
        self.assertEqual(1, len(evaluate(self.policy(secure_boot=False), on)))

    def test_secure_boot_not_measured(self) -> None:
        events = parse(
            LogWriter()
            .add(4, ev.EV_EFI_BOOT_SERVICES_APPLICATION, b"", measured=KERNEL)
            .build()
        ).events
        failures = evaluate(self.policy(), events)
        self.assertEqual([None], [f.index for f in failures])
        self.assertIn("not measured", str(failures[0]))
        self.assertEqual([], evaluate(self.policy(secure_boot=False), events))

    def test_dict_round_trip(self) -> None:
        policy = self.policy()
        self.assertEqual(policy, MeasuredBootPolicy.from_dict(policy.to_dict()))
        self.assertEqual(
            {"boot_applications": None, "firmware": None, "secure_boot": None},
            MeasuredBootPolicy.from_dict({}).to_dict(),
        )

    def test_from_dict_errors(self) -> None:
        cases = [
            ([], "JSON object"),
            ({"bogus": 1}, "unknown keys"),
            ({"secure_boot": 1}, "secure_boot"),
            ({"boot_applications": "ab"}, "boot_applications"),
            ({"firmware": [1]}, "firmware"),
            ({"firmware": ["zz"]}, "not hex"),
            ({"boot_applications": ["ab" * 20]}, "not a sha256"),
        ]
        for doc, needle in cases:
            e = self.assertRaises(MalformedError, MeasuredBootPolicy.from_dict, doc)
            self.assertEqual("measured-boot policy", e.structure)
            self.assertIn(needle, e.detail)


def tool_pcrs(raw: bytes) -> dict[str, dict[int, bytes]]:
    with tempfile.NamedTemporaryFile(suffix=".bin", delete=False) as f:
        f.write(raw)
    try:
        out = subprocess.run(
            ["tpm2_eventlog", f.name],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
    finally:
        os.unlink(f.name)
    pcrs: dict[str, dict[int, bytes]] = {}
    bank = None
    for line in out.split("\npcrs:\n", 1)[1].splitlines():
        m = re.match(r"^  (\w+):$", line)
        if m:
            bank = m.group(1)
            pcrs[bank] = {}
            continue
        m = re.match(r"^\s+(\d+)\s*:\s*0x([0-9a-fA-F]+)$", line)
        if m and bank:
            pcrs[bank][int(m.group(1))] = bytes.fromhex(m.group(2))
    return pcrs


def tool_version() -> tuple[int, ...]:
    out = subprocess.run(
        ["tpm2_eventlog", "--version"], capture_output=True, text=True
    ).stdout
    m = re.search(r'version="(\d+)\.(\d+)', out)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


class Tpm2EventlogCrossCheckTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        if shutil.which("tpm2_eventlog") is None:
            self.skipTest(
                "tpm2_eventlog (tpm2-tools) is not on PATH: cross-check skipped"
            )

    def test_all_pcrs_match(self) -> None:
        for raw in (
            sample_log(locality=None),
            sample_log(secure_boot=False, locality=None, banks=("sha256",)),
        ):
            log = parse(raw)
            ours = replay(log.events, banks=log.banks)
            self.assertEqual(ours, tool_pcrs(raw))

    def test_startup_locality_log(self) -> None:
        raw = sample_log(locality=3)
        log = parse(raw)
        ours = replay(log.events)
        theirs = tool_pcrs(raw)
        for bank in ("sha1", "sha256"):
            self.assertEqual(
                {p: v for p, v in ours[bank].items() if p},
                {p: v for p, v in theirs[bank].items() if p},
            )
            if theirs[bank][0] == ours[bank][0]:
                continue
            # tpm2-tools < 5.6 extends EV_NO_ACTION events and ignores the
            # startup locality (tpm2-tools issues #3224 and #3146): check
            # that the difference is exactly that bug.
            self.assertLess(tool_version(), (5, 6))
            size = hashlib.new(bank).digest_size
            buggy = bytes(size)
            for e in log.events[1:]:
                if e.pcr == 0:
                    buggy = hashlib.new(bank, buggy + e.digests[bank]).digest()
            self.assertEqual(buggy, theirs[bank][0])
