"""The per-node attestation state machine (verifier.protocol.attestation)
alone: no service, no database, no network, no clock. One named test per
transition and per attack.

An honest node is a :class:`SoftTpm` whose PCRs a firmware log and an
in-memory IMA list were extended into; it answers a
:class:`QuoteRequest` exactly as ``node_agent`` does. Each attack tampers
with that node or its answer.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

import hypothesis
import testtools
from hypothesis import strategies as st

from node_agent.trial.eventlog import sample_log
from node_agent.trial.ima import boot_aggregate_entry, make_entry, pcr_values, to_ascii
from trusted_testing.softtpm import SoftTpm
from verifier.protocol import (
    AttestationKey,
    MalformedError,
    PcrPolicy,
    TpmPublic,
    bind_nonce,
)
from verifier.protocol.attestation import (
    Action,
    AttestationRules,
    NodeAttestation,
    NodeState,
    Transition,
    Verdict,
)
from verifier.protocol.ima import ImaEntry, policy_from_log
from verifier.protocol.mb import MeasuredBootPolicy, parse, replay
from verifier.protocol.messages.quote import (
    ImaPart,
    QuoteAnswer,
    QuoteRequest,
)

RULES = AttestationRules(max_unreachable=3, revoke_unreachable=False, max_rounds=8)
PCR16 = hashlib.sha256(b"trusted boot chain").digest()
NOW = 1_700_000_000.0


class HonestNode:
    """A node in memory: a SoftTpm booted with a firmware log, an IMA list,
    an NK and a CSR. ``answer`` answers a request like the agent."""

    def __init__(self, secure_boot: bool = True) -> None:
        self.tpm = SoftTpm(ak_alg="ecc", ek_alg="ecc")
        self.nk = os.urandom(32)
        self.csr = b"DER of the node's identity CSR"
        self.part_size = 1000
        self.boot(secure_boot)

    def boot(self, secure_boot: bool = True) -> None:
        self.tpm.pcrs = {i: bytes(32) for i in range(24)}
        self.mb_log = sample_log(locality=None, secure_boot=secure_boot)
        events = parse(self.mb_log).events
        self.tpm.pcrs.update(replay(events, ("sha256",), range(10))["sha256"])
        self.tpm.extend(16, PCR16)
        self.ima: list[ImaEntry] = []
        self.log_only_entry(boot_aggregate_entry([self.tpm.pcrs[i] for i in range(10)]))
        self._sync_pcr10()

    def reboot(self) -> None:
        self.tpm.reset_count += 1
        self.boot()

    def measure(self, path: str, content: bytes) -> None:
        self.log_only_entry(make_entry(path, content))
        self._sync_pcr10()

    def log_only_entry(self, entry: ImaEntry) -> None:
        self.ima.append(entry)

    def _sync_pcr10(self) -> None:
        self.tpm.pcrs[10] = pcr_values(self.ima)[1]

    def answer(self, request: QuoteRequest, nonce: bytes | None = None) -> QuoteAnswer:
        nonce = request.nonce if nonce is None else nonce
        csr = self.csr if request.csr else None
        bound = (self.nk, csr) if csr is not None else (self.nk,)
        quote = self.tpm.quote(bind_nonce(nonce, *bound), request.pcrs, request.banks)
        ima = None
        if request.ima_from is not None:
            first = request.ima_from if request.ima_from <= len(self.ima) else 0
            part = self.ima[first : first + self.part_size]
            more = first + len(part) < len(self.ima)
            ima = ImaPart(first, to_ascii(part), more)
        mb_log = self.mb_log if request.mb else None
        return QuoteAnswer(quote, self.nk, csr, ima, None, mb_log)


def _nonce() -> bytes:
    return os.urandom(20)


class MachineTestBase(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.node = HonestNode()

    def machine(
        self,
        runtime: bool = False,
        mb: bool = False,
        pcr16: bool = True,
        **state: Any,
    ) -> NodeAttestation:
        policy = PcrPolicy({16: frozenset({self.node.tpm.pcrs[16]})} if pcr16 else {})
        ak = AttestationKey(TpmPublic.from_bytes(self.node.tpm.ak.to_bytes()), True)
        return NodeAttestation(
            "4b9a3f4e-94a4-4c4a-9d44-4f6f6f0e0a01",
            policy,
            ak,
            runtime=policy_from_log(self.node.ima, "golden", 1) if runtime else None,
            mb=MeasuredBootPolicy(secure_boot=True) if mb else None,
            **state,
        )

    def round(
        self,
        machine: NodeAttestation,
        answer: object = None,
        now: float = NOW,
        rules: AttestationRules = RULES,
    ) -> Verdict:
        """One honest round (or ``answer`` given for the request)."""
        request = machine.request(_nonce())
        if answer is None:
            answer = self.node.answer(request)
        elif callable(answer):
            answer = answer(request)
        return machine.judge(request, answer, now, rules)

    def attested(self, **kwargs: Any) -> NodeAttestation:
        """A machine through bootstrap: V released, attested."""
        machine = self.machine(**kwargs)
        verdict = self.round(machine)
        self.assertEqual(Action.RELEASE_V, verdict.action)
        self.apply(machine, verdict)
        self.apply(machine, machine.v_delivered())
        self.assertEqual(NodeState.ATTESTED, machine.state)
        return machine

    def apply(self, machine: NodeAttestation, verdict: Verdict) -> None:
        assert verdict.transition is not None
        machine.apply(verdict.transition)

    def assert_revoked(self, verdict: Verdict, reason: str) -> Transition:
        self.assertEqual(Action.REVOKE, verdict.action, verdict)
        self.assertFalse(verdict)
        change = verdict.transition
        assert change is not None
        self.assertEqual(NodeState.REVOKED, change.state)
        self.assertEqual(reason, change.reason, change.detail)
        assert change.failure_reason is not None
        self.assertTrue(change.failure_reason.startswith(f"{reason}: "))
        return change


class TransitionTest(MachineTestBase):
    def test_first_good_quote_releases_v_and_moves_to_bootstrapping(self) -> None:
        machine = self.machine()
        request = machine.request(_nonce())
        self.assertTrue(request.csr)
        verdict = machine.judge(request, self.node.answer(request), NOW, RULES)
        self.assertEqual(Action.RELEASE_V, verdict.action)
        self.assertTrue(verdict)
        self.assertEqual(Transition(NodeState.BOOTSTRAPPING), verdict.transition)
        self.assertEqual((self.node.nk, self.node.csr), (verdict.nk, verdict.csr))
        assert verdict.attest is not None
        self.assertEqual(
            bind_nonce(request.nonce, self.node.nk, self.node.csr),
            verdict.attest.extra_data,
        )
        self.assertEqual(NodeState.REGISTERED, machine.state)  # written ahead
        self.apply(machine, verdict)
        self.assertEqual(NodeState.BOOTSTRAPPING, machine.state)
        self.assertEqual(
            (1, NOW, True),
            (machine.quotes_verified, machine.last_attested_at, machine.dirty),
        )

    def test_v_delivered_moves_to_attested_and_stops_asking_for_the_csr(self) -> None:
        machine = self.machine()
        self.apply(machine, self.round(machine))
        verdict = machine.v_delivered()
        self.assertEqual(
            Transition(NodeState.ATTESTED, v_released=True), verdict.transition
        )
        self.apply(machine, verdict)
        self.assertTrue(machine.v_released)
        request = machine.request(_nonce())
        self.assertFalse(request.csr)
        verdict = machine.judge(request, self.node.answer(request), NOW + 1, RULES)
        self.assertEqual(
            Verdict(Action.WAIT, None, self.node.nk, None, verdict.attest), verdict
        )
        self.assertEqual(
            (2, NOW + 1), (machine.quotes_verified, machine.last_attested_at)
        )

    def test_v_not_delivered_is_released_again_on_the_next_quote(self) -> None:
        machine = self.machine()
        self.apply(machine, self.round(machine))
        verdict = self.round(machine)  # V did not reach the node
        self.assertEqual(Action.RELEASE_V, verdict.action)
        self.assertIsNone(verdict.transition)  # bootstrapping already
        self.assertEqual(self.node.csr, verdict.csr)

    def test_unreachable_node_is_marked_unreachable_not_revoked(self) -> None:
        machine = self.attested()
        for i in range(1, RULES.max_unreachable):
            self.assertEqual(
                Verdict(Action.WAIT), machine.transport_failed("refused", RULES)
            )
            self.assertEqual(i, machine.unreachable)
        verdict = machine.transport_failed("refused", RULES)
        self.assertEqual(Action.FAIL, verdict.action)
        self.assertEqual(
            Transition(NodeState.UNREACHABLE, "unreachable", "refused"),
            verdict.transition,
        )
        self.apply(machine, verdict)
        self.assertEqual("unreachable: refused", machine.failure_reason)
        # an unreachable node stays so: no new transition, nothing revoked
        for _ in range(5):
            self.assertEqual(
                Verdict(Action.WAIT), machine.transport_failed("refused", RULES)
            )
        self.assertEqual(NodeState.UNREACHABLE, machine.state)

    def test_unreachable_node_keeps_the_latest_failure_reason(self) -> None:
        machine = self.attested()
        for _ in range(RULES.max_unreachable):
            verdict = machine.transport_failed("refused", RULES)
        self.apply(machine, verdict)
        verdict = machine.transport_failed("pin mismatch", RULES)
        self.assertEqual(Action.WAIT, verdict.action)
        self.assertEqual(
            Transition(NodeState.UNREACHABLE, "unreachable", "pin mismatch"),
            verdict.transition,
        )
        self.apply(machine, verdict)
        self.assertEqual("unreachable: pin mismatch", machine.failure_reason)
        self.assertEqual(NodeState.UNREACHABLE, machine.state)
        # the same reason again: nothing new to write
        verdict = machine.transport_failed("pin mismatch", RULES)
        self.assertEqual(Verdict(Action.WAIT), verdict)

    def test_unreachable_node_is_revoked_under_the_revoke_rule(self) -> None:
        machine = self.attested()
        rules = dataclasses.replace(RULES, revoke_unreachable=True)
        for _ in range(RULES.max_unreachable - 1):
            machine.transport_failed("timeout", rules)
        self.assert_revoked(machine.transport_failed("timeout", rules), "unreachable")

    def test_unreachable_node_comes_back_attested_on_a_good_quote(self) -> None:
        machine = self.attested()
        for _ in range(RULES.max_unreachable):
            verdict = machine.transport_failed("refused", RULES)
        self.apply(machine, verdict)
        verdict = self.round(machine)
        self.assertEqual(Action.WAIT, verdict.action)
        self.assertEqual(Transition(NodeState.ATTESTED), verdict.transition)
        self.apply(machine, verdict)
        self.assertEqual(
            (NodeState.ATTESTED, None, 0),
            (machine.state, machine.failure_reason, machine.unreachable),
        )

    def test_unreachable_node_without_v_comes_back_through_bootstrapping(
        self,
    ) -> None:
        machine = self.machine()
        for _ in range(RULES.max_unreachable):
            verdict = machine.transport_failed("refused", RULES)
        self.apply(machine, verdict)
        verdict = self.round(machine)
        self.assertEqual(Action.RELEASE_V, verdict.action)
        self.assertEqual(Transition(NodeState.BOOTSTRAPPING), verdict.transition)

    def test_silence_shorter_than_the_timeout_never_revokes(self) -> None:
        machine = self.attested()  # its last good quote at NOW
        rules = dataclasses.replace(RULES, unreachable_timeout=900.0)
        for i in range(1, 60):  # a reboot of almost 15 minutes
            verdict = machine.transport_failed("refused", rules, NOW + 15 * i)
            self.assertNotEqual(Action.REVOKE, verdict.action)
            if verdict.transition is not None:
                self.apply(machine, verdict)
        self.assertEqual(NodeState.UNREACHABLE, machine.state)

    def test_silent_node_past_the_timeout_is_revoked(self) -> None:
        machine = self.attested()
        rules = dataclasses.replace(RULES, unreachable_timeout=900.0)
        for i in range(1, RULES.max_unreachable + 1):
            verdict = machine.transport_failed("refused", rules, NOW + i)
        self.apply(machine, verdict)
        verdict = machine.transport_failed("refused", rules, NOW + 900.0)
        change = self.assert_revoked(verdict, "unreachable_timeout")
        self.assertIn("no answer for 900 s", change.detail)

    def test_the_timeout_counts_from_the_last_good_quote(self) -> None:
        machine = self.attested()
        rules = dataclasses.replace(RULES, unreachable_timeout=900.0)
        for i in range(1, RULES.max_unreachable + 1):
            verdict = machine.transport_failed("refused", rules, NOW + i)
        self.apply(machine, verdict)
        self.apply(machine, self.round(machine, now=NOW + 800.0))  # recovered
        self.assertEqual(NodeState.ATTESTED, machine.state)
        verdict = machine.transport_failed("refused", rules, NOW + 1000.0)
        self.assertEqual(Verdict(Action.WAIT), verdict)  # 200 s, not 1,000

    def test_a_node_that_never_passed_is_timed_from_its_first_silence(self) -> None:
        machine = self.machine()
        rules = dataclasses.replace(RULES, unreachable_timeout=900.0)
        machine.transport_failed("refused", rules, NOW)
        self.assertNotEqual(
            Action.REVOKE, machine.transport_failed("refused", rules, NOW + 899).action
        )
        self.assert_revoked(
            machine.transport_failed("refused", rules, NOW + 900),
            "unreachable_timeout",
        )

    def test_no_timeout_never_revokes(self) -> None:
        machine = self.attested()
        rules = dataclasses.replace(RULES, unreachable_timeout=None)
        for i in range(1, 10):
            verdict = machine.transport_failed("refused", rules, NOW + 86400 * i)
            self.assertNotEqual(Action.REVOKE, verdict.action)

    def test_failed_node_that_stops_answering_becomes_unreachable(self) -> None:
        machine = self.attested()
        self.apply(machine, machine.round_failed("internal_error", "broke"))
        self.assertEqual(NodeState.FAILED, machine.state)
        for _ in range(RULES.max_unreachable):
            verdict = machine.transport_failed("refused", RULES)
        self.assertEqual(
            Transition(NodeState.UNREACHABLE, "unreachable", "refused"),
            verdict.transition,
        )

    def test_delivered_v_whose_write_failed_is_written_at_the_next_quote(self) -> None:
        machine = self.machine()
        self.apply(machine, self.round(machine))
        machine.v_delivered()  # the attested state could not be written
        self.assertEqual(NodeState.BOOTSTRAPPING, machine.state)
        verdict = self.round(machine)
        self.assertEqual(Action.WAIT, verdict.action)
        self.assertEqual(Transition(NodeState.ATTESTED), verdict.transition)

    def test_revocation_is_written_ahead(self) -> None:
        machine = self.attested()
        self.node.tpm.extend(16, b"\x01" * 32)
        verdict = self.round(machine)
        self.assert_revoked(verdict, "pcr_policy")
        self.assertEqual(NodeState.ATTESTED, machine.state)  # not written yet
        self.apply(machine, verdict)
        self.assertEqual(NodeState.REVOKED, machine.state)
        self.assertTrue(machine.failure_reason.startswith("pcr_policy: "))  # type: ignore[union-attr]

    def test_revocation_is_final(self) -> None:
        machine = self.attested()
        self.apply(machine, machine.revoke("tenant_revoked", "job done"))
        self.assertEqual("tenant_revoked: job done", machine.failure_reason)
        request = machine.request(_nonce())
        stop = Verdict(Action.STOP)
        self.assertEqual(
            stop, machine.judge(request, self.node.answer(request), NOW, RULES)
        )
        self.assertEqual(stop, machine.transport_failed("x", RULES))
        self.assertEqual(stop, machine.v_delivered())
        self.assertEqual(stop, machine.revoke("again", "x"))
        machine.apply(Transition(NodeState.ATTESTED))
        self.assertEqual(NodeState.REVOKED, machine.state)

    def test_revoked_elsewhere_stops_judging(self) -> None:
        machine = self.attested()
        machine.revoked_elsewhere()
        self.assertEqual(NodeState.REVOKED, machine.state)
        self.assertEqual(Verdict(Action.STOP), self.round(machine))

    def test_long_ima_list_in_parts_asks_again_then_passes(self) -> None:
        for i in range(7):
            self.node.measure(f"/opt/app/{i}", b"x")
        machine = self.machine(runtime=True, pcr16=False)
        self.node.part_size = 3
        asked = []
        for _ in range(2):
            request = machine.request(_nonce())
            asked.append(request.ima_from)
            verdict = machine.judge(request, self.node.answer(request), NOW, RULES)
            self.assertEqual(Verdict(Action.ASK_AGAIN), verdict)
        self.assertEqual(0, machine.quotes_verified)
        verdict = self.round(machine)
        self.assertEqual(Action.RELEASE_V, verdict.action)
        self.assertEqual([0, 3], asked)
        self.assertEqual(8, machine.ima.count)
        self.assertEqual(1, machine.quotes_verified)

    def test_evidence_never_complete_is_revoked_after_max_rounds(self) -> None:
        machine = self.machine(runtime=True, pcr16=False)

        def endless(request: QuoteRequest) -> QuoteAnswer:
            answer = self.node.answer(request)
            return dataclasses.replace(
                answer, ima=ImaPart(request.ima_from or 0, "", True)
            )

        for _ in range(RULES.max_rounds - 1):
            self.assertEqual(Action.ASK_AGAIN, self.round(machine, endless).action)
        self.assert_revoked(self.round(machine, endless), "evidence_incomplete")

    def test_firmware_log_is_asked_once_per_boot_and_again_after_a_reboot(self) -> None:
        self.node.measure("/usr/bin/python3", b"py")
        machine = self.attested(runtime=True, mb=True, pcr16=False)
        self.assertEqual(0, machine.mb_boot)
        self.assertFalse(machine.request(_nonce()).mb)
        self.node.reboot()
        self.node.measure("/usr/bin/python3", b"py")
        # asked before the reboot was known: no log, list from the old index
        verdict = self.round(machine)
        self.assertEqual(Verdict(Action.ASK_AGAIN), verdict)
        request = machine.request(_nonce())
        self.assertEqual((True, 0), (request.mb, request.ima_from))
        verdict = machine.judge(request, self.node.answer(request), NOW, RULES)
        self.assertEqual(Action.WAIT, verdict.action, verdict)
        self.assertEqual((1, 2), (machine.mb_boot, machine.ima.count))

    def test_snapshot_holds_the_hot_state(self) -> None:
        machine = self.attested(runtime=True, pcr16=False)
        hot = machine.snapshot()
        self.assertEqual(
            (NOW, 1, machine.clock, machine.ima),
            (hot.last_attested_at, hot.quotes_verified, hot.clock, hot.ima),
        )
        self.assertIsNone(self.attested().snapshot().ima)  # no runtime policy

    def test_restored_state_continues_where_it_was_written(self) -> None:
        self.node.measure("/usr/bin/python3", b"py")
        first = self.attested(runtime=True, pcr16=False)
        hot = first.snapshot()
        again = self.machine(
            runtime=True,
            pcr16=False,
            state=NodeState.ATTESTED,
            clock=hot.clock,
            ima=hot.ima,
            v_released=True,
            quotes_verified=hot.quotes_verified,
        )
        self.node.measure("/usr/bin/python3", b"py")
        request = again.request(_nonce())
        self.assertEqual((False, hot.ima.count), (request.csr, request.ima_from))  # type: ignore[union-attr]
        self.assertEqual(
            Action.WAIT,
            again.judge(request, self.node.answer(request), NOW, RULES).action,
        )

    def test_nodes_of_one_policy_share_their_pcr_selection(self) -> None:
        a, b = self.machine(runtime=True), self.machine(runtime=True)
        self.assertEqual((10, 16), a.quoted_pcrs)
        self.assertIs(a.quoted_pcrs, b.quoted_pcrs)


class AttackTest(MachineTestBase):
    def test_replayed_quote_with_old_nonce_is_rejected(self) -> None:
        machine = self.attested()
        old = machine.request(_nonce())
        recorded = self.node.answer(old)
        self.assert_revoked(self.round(machine, recorded), "nonce_mismatch")

    def test_older_quote_for_the_same_request_is_rejected(self) -> None:
        machine = self.attested()
        request = machine.request(_nonce())
        older = self.node.answer(request)
        newer = self.node.answer(request)
        self.assertEqual(Action.WAIT, machine.judge(request, newer, NOW, RULES).action)
        self.assert_revoked(machine.judge(request, older, NOW, RULES), "clock_rollback")

    def test_clock_rollback_is_rejected(self) -> None:
        machine = self.attested()
        self.node.tpm.clock -= 200
        self.assert_revoked(self.round(machine), "clock_rollback")

    def test_reset_count_rollback_is_rejected(self) -> None:
        self.node.tpm.reset_count = 5
        machine = self.attested()
        self.node.tpm.reset_count = 4
        self.assert_revoked(self.round(machine), "clock_rollback")

    def test_quote_signed_by_another_ak_is_rejected(self) -> None:
        machine = self.attested()
        self.node.tpm = SoftTpm(ak_alg="ecc", ek_alg="ecc")  # another TPM
        self.node.tpm.extend(16, PCR16)
        self.assert_revoked(self.round(machine), "signature_invalid")

    def test_pcr_mismatch_is_rejected(self) -> None:
        machine = self.attested()
        self.node.tpm.extend(16, hashlib.sha256(b"rootkit").digest())
        self.assert_revoked(self.round(machine), "pcr_policy")

    def test_pcr_mismatch_shows_the_value_the_node_reported(self) -> None:
        # Issue 18: the reason named the PCR but not what the node reported.
        machine = self.attested()
        self.node.tpm.extend(16, hashlib.sha256(b"rootkit").digest())
        reported = self.node.tpm.pcrs[16].hex()
        change = self.assert_revoked(self.round(machine), "pcr_policy")
        self.assertIn(f"the node reported PCR 16 = {reported}", change.detail)

    def test_pcr_mismatch_on_first_quote_never_releases_v(self) -> None:
        machine = self.machine()
        self.node.tpm.extend(16, b"\x01" * 32)
        verdict = self.round(machine)
        self.assert_revoked(verdict, "pcr_policy")
        self.assertIsNone(verdict.nk)

    def test_swapped_nk_is_a_nonce_mismatch(self) -> None:
        machine = self.attested()

        def swapped(request: QuoteRequest) -> QuoteAnswer:
            return dataclasses.replace(self.node.answer(request), nk=os.urandom(32))

        self.assert_revoked(self.round(machine, swapped), "nonce_mismatch")

    def test_swapped_csr_is_a_nonce_mismatch(self) -> None:
        machine = self.machine()

        def swapped(request: QuoteRequest) -> QuoteAnswer:
            return dataclasses.replace(self.node.answer(request), csr=b"attacker's CSR")

        self.assert_revoked(self.round(machine, swapped), "nonce_mismatch")

    def test_missing_csr_on_the_first_quote_is_malformed(self) -> None:
        machine = self.machine()

        def no_csr(request: QuoteRequest) -> QuoteAnswer:
            return dataclasses.replace(self.node.answer(request), csr=None)

        self.assert_revoked(self.round(machine, no_csr), "malformed")

    def test_nk_of_the_wrong_length_is_malformed(self) -> None:
        # a valid quote binding a 5-byte "NK": V could not be sealed to it
        machine = self.machine()
        request = machine.request(_nonce())
        self.node.nk = b"\x01" * 5
        quote = self.node.tpm.quote(
            bind_nonce(request.nonce, self.node.nk, self.node.csr), request.pcrs
        )
        wire = {"quote": quote.to_dict(), "nk": "AQEBAQE=", "csr": "Y3Ny"}
        self.assert_revoked(machine.judge(request, wire, NOW, RULES), "malformed")

    def test_answer_that_is_not_an_object_is_malformed(self) -> None:
        machine = self.machine()
        for answer in (None, [], "quote", 42, b"bytes"):
            self.assert_revoked(self.round(machine, lambda r, a=answer: a), "malformed")

    def test_answer_that_is_not_json_is_malformed(self) -> None:
        machine = self.machine()
        unreadable = MalformedError("agent answer", "response is not JSON")
        change = self.assert_revoked(self.round(machine, unreadable), "malformed")
        self.assertIn("not JSON", change.detail)

    def test_answer_without_quote_is_malformed(self) -> None:
        machine = self.machine()

        def wire(request: QuoteRequest) -> dict[str, Any]:
            out = self.node.answer(request).to_dict()
            del out["quote"]
            return out

        self.assert_revoked(self.round(machine, wire), "malformed")

    def test_forged_boot_aggregate_in_a_list_sent_in_parts_is_rejected(
        self,
    ) -> None:
        # entry 0 does not match PCRs 0-9; the list comes in parts, so the
        # quote that checks PCRs 0-9 sees entry 0 in an earlier part only
        self.node.ima[0] = boot_aggregate_entry([bytes(32)] * 10)
        for i in range(5):
            self.node.measure(f"/opt/app/{i}", b"x")
        machine = self.machine(runtime=True, mb=True, pcr16=False)
        self.node.part_size = 3
        verdict = self.round(machine)
        self.assertEqual(Verdict(Action.ASK_AGAIN), verdict)
        self.assert_revoked(self.round(machine), "ima_boot_aggregate")

    def test_ima_gap_is_rejected(self) -> None:
        self.node.measure("/usr/bin/python3", b"py")
        machine = self.attested(runtime=True, pcr16=False)
        self.node.measure("/usr/bin/python3", b"py")

        def from_zero(request: QuoteRequest) -> QuoteAnswer:
            answer = self.node.answer(request)
            return dataclasses.replace(answer, ima=ImaPart(0, to_ascii(self.node.ima)))

        self.assert_revoked(self.round(machine, from_zero), "ima_log_gap")

    def test_hidden_ima_entry_does_not_replay_to_pcr10(self) -> None:
        machine = self.attested(runtime=True, pcr16=False)
        self.node.tpm.extend(10, os.urandom(32))  # measured, left out of the list
        self.assert_revoked(self.round(machine), "ima_pcr_mismatch")

    def test_unknown_executable_is_rejected_and_named(self) -> None:
        machine = self.attested(runtime=True, pcr16=False)
        self.node.measure("/tmp/.x/rootkit", b"evil")
        change = self.assert_revoked(self.round(machine), "ima_policy")
        self.assertIn("/tmp/.x/rootkit", change.detail)

    def test_missing_ima_list_is_rejected(self) -> None:
        machine = self.machine(runtime=True, pcr16=False)

        def no_list(request: QuoteRequest) -> QuoteAnswer:
            answer = self.node.answer(request)
            return dataclasses.replace(answer, ima=None, ima_error="ima: No such file")

        change = self.assert_revoked(
            self.round(machine, no_list), "ima_log_unavailable"
        )
        self.assertIn("No such file", change.detail)

    def test_ima_list_left_out_silently_is_malformed(self) -> None:
        machine = self.machine(runtime=True, pcr16=False)

        def silent(request: QuoteRequest) -> QuoteAnswer:
            return dataclasses.replace(self.node.answer(request), ima=None)

        self.assert_revoked(self.round(machine, silent), "malformed")

    def test_missing_firmware_log_is_rejected(self) -> None:
        machine = self.machine(mb=True)

        def no_log(request: QuoteRequest) -> QuoteAnswer:
            answer = self.node.answer(request)
            return dataclasses.replace(answer, mb_log=None, mb_error="no log")

        self.assert_revoked(self.round(machine, no_log), "mb_log_unavailable")

    def test_secure_boot_off_fails_measured_boot_before_v(self) -> None:
        self.node.boot(secure_boot=False)
        machine = self.machine(mb=True)
        verdict = self.round(machine)
        self.assert_revoked(verdict, "mb_policy")
        self.assertIsNone(verdict.nk)

    def test_firmware_log_not_matching_the_quote_is_rejected(self) -> None:
        self.node.tpm.extend(4, os.urandom(32))  # a boot application not logged
        machine = self.machine(mb=True)
        self.assert_revoked(self.round(machine), "mb_pcr_mismatch")

    def test_a_check_that_breaks_fails_closed(self) -> None:
        class BrokenPolicy(PcrPolicy):
            def mismatches(self, values: Mapping[int, bytes]) -> list[int]:
                raise KeyError("a bug in a check")

        machine = self.machine()
        machine.policy = BrokenPolicy(machine.policy.allowed)
        change = self.assert_revoked(self.round(machine), "check_error")
        self.assertIn("KeyError", change.detail)

    @hypothesis.settings(max_examples=150, deadline=None)
    @hypothesis.given(
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=20),
            lambda inner: (
                st.lists(inner, max_size=3)
                | st.dictionaries(
                    st.sampled_from(["quote", "nk", "csr", "ima", "mb_log", "x"]),
                    inner,
                    max_size=4,
                )
            ),
            max_leaves=12,
        )
    )
    def test_judge_never_raises_on_any_json(self, answer: object) -> None:
        machine = self.machine(runtime=True, mb=True)
        json.dumps(answer)  # what an agent could send
        verdict = self.round(machine, lambda r: answer)
        self.assertEqual(Action.REVOKE, verdict.action)
        assert verdict.transition is not None
        self.assertEqual("malformed", verdict.transition.reason)


class PurityTest(testtools.TestCase):
    def test_the_state_machine_imports_no_service_code(self) -> None:
        code = (
            "import sys, verifier.protocol.attestation, "
            "verifier.protocol.messages.quote;"
            "print('\\n'.join(sys.modules))"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.split()
        ours = {m.split(".")[0] for m in out} & {
            "node_agent",
            "nova_plugin",
            "vtpm_manager",
            "trusted_testing",
            "ipsec_puppet_vault_hooks",
            "sqlalchemy",
            "aiohttp",
            "oslo_config",
        }
        self.assertEqual(set(), ours)
        services = [
            m
            for m in out
            if m.startswith("verifier.") and not m.startswith("verifier.protocol")
        ]
        self.assertEqual([], services)
