"""Legacy SHA-1 firmware logs and sha1 IMA boot aggregates judged end to
end against quotes over the sha1 bank (issue 32, item 5), in the
attestation state machine with a SoftTpm node that has both banks active
(as a TPM manufactured with sha1 and sha256 has: see
test_eventlog_swtpm for swtpm's banks).

The verifier asks for the sha256 bank only until the node shows it needs
sha1 (a legacy log, a sha1 boot_aggregate), then asks again over both: an
agent that ignores ``banks`` (older, or a TPM without the bank) is judged
on sha256 and refused naming why.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable

from node_agent.trial.eventlog import LegacyLogWriter, efi_variable_data
from node_agent.trial.ima import boot_aggregate_entry
from verifier.protocol.attestation import Action, NodeState
from verifier.protocol.mb import eventlog as ev
from verifier.protocol.mb import parse, replay
from verifier.protocol.mb.policy import EFI_GLOBAL_VARIABLE
from verifier.protocol.messages.quote import QuoteAnswer, QuoteRequest
from verifier.tests.unit.test_attestation_machine import (
    NOW,
    RULES,
    HonestNode,
    MachineTestBase,
)

MEASURED = (
    (0, ev.EV_S_CRTM_VERSION, "1.0".encode("utf-16-le"), None),
    (
        7,
        ev.EV_EFI_VARIABLE_DRIVER_CONFIG,
        efi_variable_data(EFI_GLOBAL_VARIABLE, "SecureBoot", b"\x01"),
        None,
    ),
    *((pcr, ev.EV_SEPARATOR, bytes(4), None) for pcr in range(8)),
    (4, ev.EV_EFI_BOOT_SERVICES_APPLICATION, bytes(32), b"shim image"),
)


class LegacyNode(HonestNode):
    """Firmware that logs in the TCG 1.2 format (sha1 digests only) on a TPM
    with both banks: each bank is extended with its own hash of the same
    content, the log records the sha1 ones."""

    def boot(self, secure_boot: bool = True) -> None:
        super().boot(secure_boot)
        writer = LegacyLogWriter()
        sha1 = {i: bytes(20) for i in range(24)}
        sha256 = dict(self.tpm.pcrs)
        for i in range(10):
            sha256[i] = bytes(32)
        for pcr, event_type, data, measured in MEASURED:
            content = data if measured is None else measured
            writer.add(pcr, event_type, data, measured)
            for bank, values in (("sha1", sha1), ("sha256", sha256)):
                values[pcr] = hashlib.new(
                    bank, values[pcr] + hashlib.new(bank, content).digest()
                ).digest()
        self.mb_log = writer.build()
        self.tpm.pcrs = sha256
        self.tpm.sha1_pcrs = sha1


class Sha1AggregateNode(HonestNode):
    """A crypto-agile log and an IMA whose hash is sha1: its boot_aggregate
    is sha1 over the sha1 bank's PCRs 0-7."""

    def boot(self, secure_boot: bool = True) -> None:
        super().boot(secure_boot)
        events = parse(self.mb_log).events
        sha1 = replay(events, ("sha1",), range(10))["sha1"]
        self.tpm.sha1_pcrs = {i: sha1.get(i, bytes(20)) for i in range(24)}
        values = [self.tpm.sha1_pcrs[i] for i in range(10)]
        self.ima = [boot_aggregate_entry(values, algorithm="sha1")]
        self._sync_pcr10()


def _sha256_only(node: HonestNode) -> Callable[[QuoteRequest], QuoteAnswer]:
    """An agent that does not know ``banks`` (or a TPM without sha1)."""

    def answer(request: QuoteRequest) -> QuoteAnswer:
        return node.answer(dataclasses.replace(request, banks=("sha256",)))

    return answer


class LegacyLogEndToEndTest(MachineTestBase):
    def setUp(self) -> None:
        super().setUp()
        self.node = LegacyNode()

    def test_legacy_sha1_log_is_judged_against_the_quoted_sha1_bank(self) -> None:
        machine = self.machine(mb=True)
        first = machine.request(b"n" * 20)
        self.assertEqual(("sha256",), first.banks)
        verdict = machine.judge(first, self.node.answer(first), NOW, RULES)
        self.assertEqual(Action.ASK_AGAIN, verdict.action)
        second = machine.request(b"m" * 20)
        self.assertEqual(("sha256", "sha1"), second.banks)
        self.assertTrue(second.mb)
        verdict = machine.judge(second, self.node.answer(second), NOW, RULES)
        self.assertEqual(Action.RELEASE_V, verdict.action, verdict)

    def test_legacy_log_not_matching_the_sha1_bank_is_revoked(self) -> None:
        self.node.tpm.extend_sha1(4, hashlib.sha1(b"another shim").digest())
        machine = self.machine(mb=True)
        self.assertEqual(Action.ASK_AGAIN, self.round(machine).action)
        change = self.assert_revoked(self.round(machine), "mb_pcr_mismatch")
        self.assertIn("sha1 bank: PCR 4", change.detail)

    def test_legacy_log_from_an_agent_without_the_sha1_bank_names_why(self) -> None:
        machine = self.machine(mb=True)
        old = _sha256_only(self.node)
        self.assertEqual(Action.ASK_AGAIN, self.round(machine, old).action)
        change = self.assert_revoked(self.round(machine, old), "mb_missing_digest")
        self.assertIn("legacy SHA-1 log", change.detail)
        self.assertIn(
            "no active sha1 bank, or its agent does not quote it", change.detail
        )


class Sha1BootAggregateEndToEndTest(MachineTestBase):
    def setUp(self) -> None:
        super().setUp()
        self.node = Sha1AggregateNode()

    def test_sha1_boot_aggregate_is_judged_against_the_sha1_bank(self) -> None:
        machine = self.machine(runtime=True, mb=True)
        self.assertEqual(Action.ASK_AGAIN, self.round(machine).action)
        verdict = self.round(machine)
        self.assertEqual(Action.RELEASE_V, verdict.action, verdict)
        self.apply(machine, verdict)
        self.assertEqual(NodeState.BOOTSTRAPPING, machine.state)

    def test_sha1_boot_aggregate_over_other_pcrs_is_revoked(self) -> None:
        self.node.tpm.extend_sha1(7, hashlib.sha1(b"another db").digest())
        machine = self.machine(runtime=True, mb=True)
        self.assertEqual(Action.ASK_AGAIN, self.round(machine).action)
        change = self.assert_revoked(self.round(machine), "ima_boot_aggregate")
        self.assertIn(
            "sha1 boot_aggregate does not match the quoted PCRs 0-7", change.detail
        )
