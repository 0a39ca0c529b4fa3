"""verifier.protocol.evidence: the IMA and firmware-log checks that come
with a quote, one named test per attack or bad input."""

from __future__ import annotations

import base64
import hashlib

import testtools

from node_agent.trial.eventlog import sample_log
from node_agent.trial.ima import (
    boot_aggregate_entry,
    make_entry,
    pcr_values,
    to_ascii,
    to_binary,
)
from verifier.protocol import EvidenceError, MalformedError
from verifier.protocol.evidence import (
    MAX_IMA_BYTES,
    ImaEvidence,
    check_ima,
    check_measured_boot,
    extend_ima,
    parse_ima_evidence,
    parse_mb_log,
)
from verifier.protocol.ima import ReplayState, RuntimePolicy, policy_from_log
from verifier.protocol.mb import MeasuredBootPolicy, parse, replay

BOOT = [hashlib.sha256(bytes([i])).digest() for i in range(10)]


def _log(*paths: str) -> list:  # type: ignore[type-arg]
    return [boot_aggregate_entry(BOOT)] + [make_entry(p, p.encode()) for p in paths]


def _pcrs(entries: list, with_boot: bool = True) -> dict[int, bytes]:  # type: ignore[type-arg]
    values = {10: pcr_values(entries)[1]}
    if with_boot:
        values.update(enumerate(BOOT))
    return values


class ImaEvidenceTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.entries = _log("/usr/bin/a", "/usr/bin/b")
        self.policy = policy_from_log(self.entries, "p", 1)

    def wire(self, entries: list, first: int = 0, form: str = "ascii") -> dict:  # type: ignore[type-arg]
        if form == "ascii":
            text = to_ascii(entries)
        else:
            text = base64.b64encode(to_binary(entries)).decode()
        return {"from": first, "format": form, "entries": text}

    def test_good_list_replays_and_passes(self) -> None:
        for form in ("ascii", "binary"):
            ev = parse_ima_evidence(self.wire(self.entries, form=form))
            state = check_ima(ReplayState(), ev, _pcrs(self.entries), self.policy)
            self.assertEqual(3, state.count)

    def test_incremental_consumes_only_new_entries(self) -> None:
        state = check_ima(
            ReplayState(),
            parse_ima_evidence(self.wire(self.entries)),
            _pcrs(self.entries),
            self.policy,
        )
        more = [*self.entries, make_entry("/usr/bin/a", b"/usr/bin/a")]
        ev = parse_ima_evidence(self.wire(more[3:], first=3))
        self.assertEqual(4, check_ima(state, ev, _pcrs(more), self.policy).count)

    def test_list_ahead_of_the_quote_is_consumed_up_to_it(self) -> None:
        more = [*self.entries, make_entry("/usr/bin/a", b"/usr/bin/a")]
        ev = parse_ima_evidence(self.wire(more))
        state = check_ima(ReplayState(), ev, _pcrs(self.entries), self.policy)
        self.assertEqual(3, state.count)

    def test_attack_unknown_file(self) -> None:
        bad = [*self.entries, make_entry("/tmp/x", b"x")]
        ev = parse_ima_evidence(self.wire(bad))
        e = self.assertRaises(
            EvidenceError, check_ima, ReplayState(), ev, _pcrs(bad), self.policy
        )
        self.assertEqual("ima_policy", e.reason)
        self.assertIn("entry 3 '/tmp/x': unknown_file", e.detail)

    def test_attack_hidden_entry_breaks_replay(self) -> None:
        real = [*self.entries, make_entry("/tmp/x", b"x")]
        ev = parse_ima_evidence(self.wire(self.entries))  # /tmp/x left out
        e = self.assertRaises(
            EvidenceError, check_ima, ReplayState(), ev, _pcrs(real), self.policy
        )
        self.assertEqual("ima_pcr_mismatch", e.reason)

    def test_attack_gap_in_the_list(self) -> None:
        ev = ImaEvidence(5, [])
        e = self.assertRaises(
            EvidenceError, check_ima, ReplayState(3), ev, _pcrs([]), self.policy
        )
        self.assertEqual("ima_log_gap", e.reason)

    def test_attack_boot_aggregate_not_matching_pcrs_0_to_9(self) -> None:
        pcrs = _pcrs(self.entries)
        pcrs[4] = bytes(32)
        ev = parse_ima_evidence(self.wire(self.entries))
        e = self.assertRaises(
            EvidenceError, check_ima, ReplayState(), ev, pcrs, self.policy
        )
        self.assertEqual("ima_boot_aggregate", e.reason)

    def test_attack_boot_aggregate_in_an_earlier_part_of_the_list(self) -> None:
        # entry 0 came in a part (extend_ima) that no quote checked; the
        # quote that ends the list still checks it against PCRs 0-9
        pcrs = _pcrs(self.entries)
        pcrs[4] = bytes(32)
        first = ImaEvidence(0, self.entries[:2], True)
        state = extend_ima(ReplayState(), first, self.policy)
        last = ImaEvidence(2, self.entries[2:])
        e = self.assertRaises(
            EvidenceError,
            check_ima,
            state,
            last,
            pcrs,
            self.policy,
            self.entries[0],
        )
        self.assertEqual("ima_boot_aggregate", e.reason)
        good = check_ima(state, last, _pcrs(self.entries), self.policy, self.entries[0])
        self.assertEqual(3, good.count)

    def test_boot_aggregate_unchecked_without_pcrs_0_to_9(self) -> None:
        ev = parse_ima_evidence(self.wire(self.entries))
        pcrs = _pcrs(self.entries, with_boot=False)
        self.assertEqual(3, check_ima(ReplayState(), ev, pcrs, self.policy).count)

    def test_pcr10_not_quoted(self) -> None:
        ev = parse_ima_evidence(self.wire(self.entries))
        e = self.assertRaises(
            EvidenceError, check_ima, ReplayState(), ev, dict(enumerate(BOOT)), None
        )
        self.assertEqual("pcr_selection", e.reason)

    def test_parts_are_judged_but_only_a_quote_accepts_them(self) -> None:
        ev = parse_ima_evidence(dict(self.wire(self.entries[:2]), more=True))
        self.assertTrue(ev.more)
        state = extend_ima(ReplayState(), ev, self.policy)
        self.assertEqual(2, state.count)
        bad = [make_entry("/tmp/x", b"x")]
        e = self.assertRaises(
            EvidenceError,
            extend_ima,
            state,
            ImaEvidence(2, bad, True),
            self.policy,
        )
        self.assertEqual("ima_policy", e.reason)
        rest = parse_ima_evidence(self.wire(self.entries[2:], first=2))
        self.assertEqual(
            3, check_ima(state, rest, _pcrs(self.entries), self.policy).count
        )

    def test_malformed_wire_forms(self) -> None:
        for data, word in (
            ([], "object"),
            ({"from": -1, "format": "ascii", "entries": ""}, "non-negative"),
            ({"from": True, "format": "ascii", "entries": ""}, "non-negative"),
            ({"from": 0, "format": "xml", "entries": ""}, "format"),
            ({"from": 0, "format": "ascii", "entries": 5}, "string"),
            ({"from": 0, "format": "binary", "entries": "!!"}, "base64"),
            ({"from": 0, "format": "ascii", "entries": "", "more": 1}, "more"),
            (
                {"from": 0, "format": "ascii", "entries": "x" * (MAX_IMA_BYTES + 1)},
                "exceeds",
            ),
        ):
            e = self.assertRaises(MalformedError, parse_ima_evidence, data)
            self.assertIn(word, str(e))

    def test_truncated_binary_list_names_the_entry(self) -> None:
        raw = to_binary(self.entries)[:-3]
        data = {
            "from": 0,
            "format": "binary",
            "entries": base64.b64encode(raw).decode(),
        }
        e = self.assertRaises(MalformedError, parse_ima_evidence, data)
        self.assertIn("entry 2", str(e))

    def test_unknown_template_is_refused(self) -> None:
        line = to_ascii(self.entries[:1]).replace("ima-ng", "ima-xyz")
        data = {"from": 0, "format": "ascii", "entries": line}
        e = self.assertRaises(MalformedError, parse_ima_evidence, data)
        self.assertIn("unknown template", str(e))


class MeasuredBootEvidenceTest(testtools.TestCase):
    def pcrs(self, log: bytes) -> dict[int, bytes]:
        return replay(parse(log).events, ("sha256",), range(10))["sha256"]

    def test_good_log_matches_and_passes(self) -> None:
        log = sample_log(locality=None)
        policy = MeasuredBootPolicy(secure_boot=True)
        check_measured_boot(log, self.pcrs(log), policy)

    def test_attack_log_not_matching_quoted_pcrs(self) -> None:
        log = sample_log(locality=None)
        pcrs = self.pcrs(sample_log(locality=None, kernel=b"other kernel"))
        e = self.assertRaises(EvidenceError, check_measured_boot, log, pcrs, None)
        self.assertEqual("mb_pcr_mismatch", e.reason)
        self.assertIn("PCR 4", e.detail)

    def test_attack_secure_boot_off(self) -> None:
        log = sample_log(locality=None, secure_boot=False)
        e = self.assertRaises(
            EvidenceError,
            check_measured_boot,
            log,
            self.pcrs(log),
            MeasuredBootPolicy(secure_boot=True),
        )
        self.assertEqual("mb_policy", e.reason)

    def test_no_boot_pcr_quoted(self) -> None:
        log = sample_log(locality=None)
        e = self.assertRaises(
            EvidenceError, check_measured_boot, log, {16: bytes(32)}, None
        )
        self.assertEqual("pcr_selection", e.reason)

    def test_truncated_log_is_malformed(self) -> None:
        log = sample_log(locality=None)
        self.assertRaises(
            MalformedError, check_measured_boot, log[:-7], self.pcrs(log), None
        )

    def test_mb_log_wire_form(self) -> None:
        self.assertEqual(b"abc", parse_mb_log(base64.b64encode(b"abc").decode()))
        self.assertRaises(MalformedError, parse_mb_log, 3)
        self.assertRaises(MalformedError, parse_mb_log, "@@")
        self.assertRaises(MalformedError, parse_mb_log, "A" * (3 << 20))


class PolicyShapeTest(testtools.TestCase):
    def test_runtime_policy_from_log_accepts_its_log(self) -> None:
        entries = _log("/x")
        policy = policy_from_log(entries, "n", 2)
        self.assertIsInstance(policy, RuntimePolicy)
        check_ima(
            ReplayState(),
            ImaEvidence(0, entries),
            _pcrs(entries),
            policy,
        )
