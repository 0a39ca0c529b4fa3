"""The fleet emulator's IMA lists (issue 19, "IMA under load"): an emulated
agent's answers, judged by the real attestation state machine with the
fleet's shared runtime policy, pass round after round (the list growing,
PCR 10 extended, entries served from the index the verifier asks for),
and a list the policy does not allow, or no list at all, is revoked. No
network: the emulator's request handler is called with the verifier's
own request, its answer goes through JSON as on the wire."""

from __future__ import annotations

import hashlib
import json
import os

import fixtures
import testtools

from trusted_testing.fleet import Fleet
from trusted_testing.fleet_ima import (
    BOOT_AGGREGATE_DIGEST,
    ImaCatalogue,
    ImaLoad,
    policy_document,
)
from verifier.protocol import AttestationKey, PcrPolicy, TpmPublic
from verifier.protocol.attestation import (
    Action,
    AttestationRules,
    NodeAttestation,
    NodeState,
)
from verifier.protocol.ima import RuntimePolicy, parse_ascii, parse_binary

RULES = AttestationRules(max_unreachable=3, revoke_unreachable=False, max_rounds=8)
NOW = 1_700_000_000.0
UUID = "4b9a3f4e-94a4-4c4a-9d44-4f6f6f0e0a01"


class FleetImaTest(testtools.TestCase):
    def fleet(self, load: ImaLoad | None) -> Fleet:
        workdir = self.useFixture(fixtures.TempDir()).path
        fleet = Fleet(1, 0, "/nonexistent-ca.pem", workdir, load)
        fleet.agents[0].tpm.extend(16, hashlib.sha256(b"boot").digest())
        return fleet

    def machine(self, fleet: Fleet, policy_paths: int | None) -> NodeAttestation:
        tpm = fleet.agents[0].tpm
        runtime = None
        if policy_paths is not None:
            runtime = RuntimePolicy.from_dict(policy_document(policy_paths))
        return NodeAttestation(
            UUID,
            PcrPolicy({16: frozenset({tpm.pcrs[16]})}),
            AttestationKey(TpmPublic.from_bytes(tpm.ak.to_bytes()), True),
            runtime=runtime,
        )

    def round(self, fleet: Fleet, machine: NodeAttestation, now: float) -> Action:
        request = machine.request(os.urandom(20))
        agent = fleet.agents[0]
        status, body = fleet.handle(
            "GET", "/v1/quote", request.to_query(), b"", agent.address, "127.0.0.1"
        )
        self.assertEqual(200, status, body)
        verdict = machine.judge(request, json.loads(json.dumps(body)), now, RULES)
        if verdict.transition is not None:
            machine.apply(verdict.transition)
        if verdict.action is Action.RELEASE_V:
            machine.apply(machine.v_delivered().transition)  # type: ignore[arg-type]
        return verdict.action

    def assert_lists_pass(self, load: ImaLoad) -> None:
        fleet = self.fleet(load)
        machine = self.machine(fleet, load.paths)
        self.assertIn(10, machine.request(os.urandom(20)).pcrs)
        # 12 rounds of 7 entries: the list wraps the 20-path catalogue
        for i in range(12):
            action = self.round(fleet, machine, NOW + i)
            self.assertIn(
                action, (Action.RELEASE_V, Action.WAIT), str(machine.failure_reason)
            )
            self.assertEqual(7 * (i + 1), machine.ima.count)
        self.assertEqual(NodeState.ATTESTED, machine.state)
        self.assertEqual(84, fleet.agents[0].ima_count)
        self.assertEqual(fleet.agents[0].tpm.pcrs[10], machine.ima.sha256)

    def test_ascii_lists_pass_round_after_round(self) -> None:
        self.assert_lists_pass(ImaLoad(7, 20))

    def test_binary_lists_pass_round_after_round(self) -> None:
        self.assert_lists_pass(ImaLoad(7, 20, binary=True))

    def test_a_file_outside_the_policy_is_revoked(self) -> None:
        fleet = self.fleet(ImaLoad(7, 20))
        machine = self.machine(fleet, 10)  # allows files 0-9 only
        self.assertEqual(Action.RELEASE_V, self.round(fleet, machine, NOW))
        actions = [self.round(fleet, machine, NOW + i) for i in range(1, 3)]
        # entries 1..10 are files 0..9; entry 11 (second round) is file 10
        self.assertEqual([Action.REVOKE, Action.STOP], actions)
        self.assertEqual(NodeState.REVOKED, machine.state)
        self.assertIn("ima_policy", machine.failure_reason or "")
        self.assertIn("lib10.so.1", machine.failure_reason or "")

    def test_an_agent_without_ima_log_is_revoked(self) -> None:
        fleet = self.fleet(None)
        machine = self.machine(fleet, 20)
        self.assertEqual(Action.REVOKE, self.round(fleet, machine, NOW))
        self.assertIn("ima_log_unavailable", machine.failure_reason or "")

    def test_without_ima_from_no_list_grows(self) -> None:
        fleet = self.fleet(ImaLoad(7, 20))
        machine = self.machine(fleet, None)  # PCR policy only
        for i in range(3):
            self.assertIn(
                self.round(fleet, machine, NOW + i), (Action.RELEASE_V, Action.WAIT)
            )
        self.assertEqual(0, fleet.agents[0].ima_count)
        self.assertEqual(bytes(32), fleet.agents[0].tpm.pcrs[10])


class CatalogueTest(testtools.TestCase):
    def test_part_is_cut_at_whole_entries_with_more(self) -> None:
        for binary in (False, True):
            whole = ImaCatalogue(ImaLoad(5, 20, binary)).part(0, 30)
            budget = len(whole.entries) // 3
            cut = ImaCatalogue(ImaLoad(5, 20, binary), max_bytes=budget)
            part = cut.part(0, 30)
            self.assertTrue(part.more)
            self.assertFalse(whole.more)
            parse = parse_binary if binary else parse_ascii
            entries = parse(part.entries, 0)  # type: ignore[arg-type]
            self.assertEqual(part.entries, whole.entries[: len(part.entries)])
            self.assertTrue(0 < len(entries) < 30, len(entries))
            following = len(cut.wire[len(entries)])  # entry n is file n - 1
            self.assertLessEqual(len(part.entries), budget)
            self.assertGreater(len(part.entries) + following, budget)

    def test_an_index_past_the_end_sends_from_zero(self) -> None:
        catalogue = ImaCatalogue(ImaLoad(5, 20))
        part = catalogue.part(50, 10)
        self.assertEqual(0, part.first)
        self.assertEqual(10, len(parse_ascii(part.entries, 0)))
        first = parse_ascii(part.entries, 0)[0]
        self.assertEqual("boot_aggregate", first.path)
        self.assertEqual(BOOT_AGGREGATE_DIGEST, first.digest)
