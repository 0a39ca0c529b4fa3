"""The dry run of a candidate runtime policy in the protocol core
(:class:`verifier.protocol.attestation.PolicyDryRun`): a node's whole IMA
list, proven by a fresh quote of a SoftTpm whose PCRs a SoftKernel extends
as firmware and kernel would, judged entry by entry. One named test per
attack: none of them is ever a ``pass``.
"""

from __future__ import annotations

import atexit
import base64
import functools
import os
import shutil
import tempfile
from typing import Any

import testtools
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import x25519
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trusted_testing.softkernel import SoftKernel
from trusted_testing.softtpm import SoftTpm
from verifier.protocol import AttestationKey, MalformedError, bind_nonce
from verifier.protocol.attestation import PolicyDryRun
from verifier.protocol.attestation.dryrun import DRY_RUN_PCRS
from verifier.protocol.ima import RuntimePolicy, parse_ascii, policy_from_log
from verifier.protocol.messages.policy_check import CheckResult, NodeCheck
from verifier.protocol.messages.quote import QuoteRequest

NODE = "0b6f3c8e-2d4f-4a51-9c1e-7f3a2b5d6e80"
GOOD = (("/usr/bin/python3", b"python"), ("/usr/sbin/nginx", b"nginx"))
_RAW = serialization.Encoding.Raw, serialization.PublicFormat.Raw


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class SimNode:
    """A node: a SoftTpm, a SoftKernel writing its IMA list, an NK, and an
    agent that answers quote requests as node_agent does."""

    def __init__(self, directory: str) -> None:
        self.tpm = SoftTpm(ak_alg="ecc")
        self.kernel = SoftKernel(
            self.tpm.extend, lambda pcrs: {i: self.tpm.pcrs[i] for i in pcrs}, directory
        )
        self.kernel.boot()
        self.nk = x25519.X25519PrivateKey.generate().public_key().public_bytes(*_RAW)
        self.max_lines = 100_000

    @property
    def ak(self) -> AttestationKey:
        return AttestationKey(self.tpm.ak, activated=True)

    def lines(self) -> list[str]:
        with open(self.kernel.ima_path, encoding="utf-8") as f:
            return f.read().splitlines(keepends=True)

    def write_lines(self, lines: list[str]) -> None:
        with open(self.kernel.ima_path, "w", encoding="utf-8") as f:
            f.write("".join(lines))

    def answer(
        self,
        request: QuoteRequest,
        nonce: bytes | None = None,
        pcrs: tuple[int, ...] | None = None,
    ) -> dict[str, Any]:
        quoted = self.tpm.quote(
            bind_nonce(nonce or request.nonce, self.nk), pcrs or request.pcrs
        )
        answer: dict[str, Any] = {"quote": quoted.to_dict(), "nk": _b64(self.nk)}
        if request.ima_from is not None:
            lines = self.lines()
            first = request.ima_from if request.ima_from <= len(lines) else 0
            part = lines[first : first + self.max_lines]
            answer["ima"] = {
                "from": first,
                "format": "ascii",
                "entries": "".join(part),
                "more": first + len(part) < len(lines),
            }
        return answer


class PolicyDryRunTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.tmp = tempfile.mkdtemp(prefix="dryrun-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.node = SimNode(self.tmp)
        for path, content in GOOD:
            self.node.kernel.measure(path, content)
        self.golden = self.policy_of_list("web", 4)

    def policy_of_list(self, name: str, version: int) -> RuntimePolicy:
        entries = parse_ascii("".join(self.node.lines()))
        return policy_from_log(entries, name, version)

    def run_check(
        self, policy: RuntimePolicy | None = None, answer: Any = None
    ) -> NodeCheck:
        """Drive a dry run to its outcome with the node's own answers
        (``answer(run, request)`` replaces them)."""
        run = PolicyDryRun(NODE, self.node.ak, policy or self.golden)
        for _ in range(100):
            request = run.request(os.urandom(20))
            reply = self.node.answer(request) if answer is None else answer(request)
            outcome = run.judge(request, reply)
            if outcome is not None:
                return outcome
        self.fail("the dry run never ended")

    def assertError(self, outcome: NodeCheck, reason: str) -> None:
        self.assertEqual(CheckResult.ERROR, outcome.result, outcome)
        self.assertEqual(reason, outcome.reason, outcome.error)
        self.assertEqual((), outcome.failures)

    # -- what it judges ------------------------------------------------------

    def test_request_asks_for_the_whole_list_and_the_boot_pcrs(self) -> None:
        run = PolicyDryRun(NODE, self.node.ak, self.golden)
        request = run.request(b"n" * 20)
        self.assertEqual(0, request.ima_from)
        self.assertEqual(tuple(range(11)), request.pcrs)
        self.assertEqual(DRY_RUN_PCRS, request.pcrs)
        self.assertFalse(request.csr)
        self.assertFalse(request.mb)

    def test_list_the_candidate_allows_passes(self) -> None:
        outcome = self.run_check()
        self.assertEqual(CheckResult.PASS, outcome.result)
        self.assertEqual(3, outcome.entries)
        self.assertIsNone(outcome.error)

    def test_every_refused_entry_is_listed_not_only_the_first(self) -> None:
        self.node.kernel.measure("/usr/bin/new-tool", b"v2")
        self.node.kernel.measure("/usr/sbin/nginx", b"nginx 1.26")  # upgraded
        self.node.kernel.measure("/usr/bin/python3", b"python")  # allowed
        outcome = self.run_check()
        self.assertEqual(CheckResult.FAIL, outcome.result)
        self.assertEqual(6, outcome.entries)
        got = [(f.index, f.path, f.reason) for f in outcome.failures]
        self.assertEqual(
            [
                (3, "/usr/bin/new-tool", "unknown_file"),
                (4, "/usr/sbin/nginx", "digest_mismatch"),
            ],
            got,
        )
        self.assertEqual(2, outcome.failures_total)
        self.assertIn("sha256:", outcome.failures[0].detail)

    def test_candidate_that_adds_the_new_files_passes(self) -> None:
        self.node.kernel.measure("/usr/bin/new-tool", b"v2")
        candidate = self.policy_of_list("web", 5)
        self.assertEqual(CheckResult.FAIL, self.run_check(self.golden).result)
        self.assertEqual(CheckResult.PASS, self.run_check(candidate).result)

    def test_list_sent_in_parts_is_judged_whole(self) -> None:
        for i in range(7):
            self.node.kernel.measure(f"/opt/app/{i}", b"x")
        self.node.max_lines = 2
        outcome = self.run_check()
        self.assertEqual(CheckResult.FAIL, outcome.result)
        self.assertEqual(10, outcome.entries)
        self.assertEqual(list(range(3, 10)), [f.index for f in outcome.failures])

    def test_entries_the_quote_does_not_cover_are_not_judged(self) -> None:
        # read after the quote: the kernel appended it, not extended yet
        self.node.kernel.log_only("/usr/bin/late", b"late")
        outcome = self.run_check()
        self.assertEqual(CheckResult.PASS, outcome.result)
        self.assertEqual(3, outcome.entries)

    # -- attacks: each an error, never a pass ----------------------------------

    def test_forged_list_that_does_not_replay_is_an_error(self) -> None:
        # the node ran a dropped binary, then rewrites its list to show an
        # allowed file in its place: no prefix replays to the quoted PCR 10
        self.node.kernel.measure("/tmp/.x/miner", b"miner")
        lines = self.node.lines()
        forged = self.node.kernel.entries[1].to_ascii() + "\n"
        self.node.write_lines([*lines[:-1], forged])
        self.assertError(self.run_check(), "ima_pcr_mismatch")

    def test_list_with_an_entry_removed_is_an_error(self) -> None:
        self.node.kernel.measure("/tmp/.x/miner", b"miner")
        self.node.kernel.measure(*GOOD[0])
        lines = self.node.lines()
        self.node.write_lines([*lines[:3], lines[4]])
        self.assertError(self.run_check(), "ima_pcr_mismatch")

    def test_quote_with_wrong_nonce_is_an_error(self) -> None:
        def stale(request: QuoteRequest) -> dict[str, Any]:
            return self.node.answer(request, nonce=b"an old nonce, replayed")

        self.assertError(self.run_check(answer=stale), "nonce_mismatch")

    def test_quote_bound_to_another_nk_is_an_error(self) -> None:
        def swapped(request: QuoteRequest) -> dict[str, Any]:
            answer = self.node.answer(request)
            answer["nk"] = _b64(os.urandom(32))
            return answer

        self.assertError(self.run_check(answer=swapped), "nonce_mismatch")

    def test_quote_by_another_tpm_is_an_error(self) -> None:
        impostor = SimNode(tempfile.mkdtemp(dir=self.tmp))
        impostor.write_lines(self.node.lines())
        self.assertError(self.run_check(answer=impostor.answer), "signature_invalid")

    def test_quote_without_the_boot_pcrs_is_an_error(self) -> None:
        def narrow(request: QuoteRequest) -> dict[str, Any]:
            return self.node.answer(request, pcrs=(10,))

        self.assertError(self.run_check(answer=narrow), "pcr_selection")

    def test_boot_aggregate_of_other_boot_pcrs_is_an_error(self) -> None:
        # the list is of another boot chain than the PCRs 0-9 the TPM holds
        self.node.tpm.extend(4, b"\x01" * 32)
        self.assertError(self.run_check(), "ima_boot_aggregate")

    def test_list_not_from_entry_zero_is_an_error(self) -> None:
        def skipped(request: QuoteRequest) -> dict[str, Any]:
            answer = self.node.answer(request)
            lines = self.node.lines()
            answer["ima"] = {
                "from": 1,
                "format": "ascii",
                "entries": "".join(lines[1:]),
            }
            return answer

        self.assertError(self.run_check(answer=skipped), "ima_log_gap")

    def test_entry_zero_that_is_not_the_boot_aggregate_is_an_error(self) -> None:
        lines = self.node.lines()
        self.node.write_lines(lines[1:])
        outcome = self.run_check()
        self.assertEqual(CheckResult.ERROR, outcome.result)
        self.assertIn(outcome.reason, ("ima_boot_aggregate", "ima_pcr_mismatch"))

    def test_tampered_template_hash_is_an_error(self) -> None:
        lines = self.node.lines()
        fields = lines[1].split(" ")
        fields[1] = "00" * 19 + "01"
        self.node.write_lines([lines[0], " ".join(fields), *lines[2:]])
        self.assertError(self.run_check(), "ima_template_hash")

    def test_answer_that_is_not_json_is_an_error(self) -> None:
        def garbage(request: QuoteRequest) -> object:
            return MalformedError("agent answer", "response is not JSON")

        self.assertError(self.run_check(answer=garbage), "malformed")

    def test_answer_without_the_list_is_an_error(self) -> None:
        def bare(request: QuoteRequest) -> dict[str, Any]:
            answer = self.node.answer(request)
            del answer["ima"]
            return answer

        self.assertError(self.run_check(answer=bare), "malformed")

    def test_answer_of_wrong_shape_is_an_error(self) -> None:
        for bad in ([], "quote", {"quote": 3}, {"quote": {}, "nk": "!!"}):
            with self.subTest(bad=bad):
                self.assertError(self.run_check(answer=lambda r, b=bad: b), "malformed")

    def test_node_that_cannot_read_its_list_is_an_error(self) -> None:
        def unreadable(request: QuoteRequest) -> dict[str, Any]:
            answer = self.node.answer(request)
            del answer["ima"]
            answer["ima_error"] = "permission denied"
            return answer

        self.assertError(self.run_check(answer=unreadable), "ima_log_unavailable")

    def test_empty_list_is_an_error_not_a_pass(self) -> None:
        self.node.tpm.pcrs[10] = bytes(32)
        self.node.write_lines([])
        self.assertError(self.run_check(), "ima_log_empty")

    def test_reboot_between_parts_is_an_error(self) -> None:
        self.node.max_lines = 2

        def rebooting(request: QuoteRequest) -> dict[str, Any]:
            if request.ima_from:
                self.node.tpm.reset_count += 1
            return self.node.answer(request)

        self.assertError(self.run_check(answer=rebooting), "node_rebooted")

    def test_list_that_never_ends_is_an_error(self) -> None:
        def endless(request: QuoteRequest) -> dict[str, Any]:
            answer = self.node.answer(request)
            self.node.kernel.measure(f"/opt/{request.ima_from}", b"more")
            answer["ima"]["more"] = True
            return answer

        self.node.max_lines = 1
        self.assertError(self.run_check(answer=endless), "evidence_incomplete")

    def test_failures_of_parts_the_last_quote_disowns_are_not_a_fail(self) -> None:
        # parts are judged as they come, but only the last quote proves
        # them: a part the quote does not cover makes the whole an error
        self.node.max_lines = 2
        for i in range(3):
            self.node.kernel.log_only(f"/forged/{i}", b"f")
        self.assertError(self.run_check(), "ima_pcr_mismatch")


class PolicyDryRunFuzzTest(testtools.TestCase):
    """Whatever a node answers, judging it never raises and is never a
    ``pass`` unless it is the node's own proven list."""

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def test_any_answer_is_judged_never_raised(self, data: st.DataObject) -> None:
        node, policy = _fuzz_node()
        run = PolicyDryRun(NODE, node.ak, policy)
        request = run.request(b"\x01" * 20)
        good = node.answer(request)
        field = data.draw(st.sampled_from(["quote", "nk", "ima", "extra"]))
        value = data.draw(_JSON | st.text(max_size=60))
        answer = dict(good)
        answer[field] = value
        outcome = run.judge(request, answer)
        assert outcome is not None
        if outcome.result is CheckResult.PASS:
            self.assertEqual(field, "extra")  # only an ignored field may vary
        else:
            self.assertEqual(CheckResult.ERROR, outcome.result, outcome)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


@functools.cache
def _fuzz_node() -> tuple[SimNode, RuntimePolicy]:
    """One node for every example (a SoftTpm key costs milliseconds)."""
    directory = tempfile.mkdtemp(prefix="dryrun-fuzz-")
    atexit.register(shutil.rmtree, directory, True)
    node = SimNode(directory)
    return node, policy_from_log(parse_ascii("".join(node.lines())), "web", 1)
