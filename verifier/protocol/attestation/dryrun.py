"""The dry run of a candidate runtime policy on one node: its whole
current IMA list, proven by a fresh quote, judged entry by entry.

A :class:`PolicyDryRun` asks the node (:meth:`~PolicyDryRun.request`) for
a quote of PCRs 0-10 over a fresh nonce with its IMA list from entry 0,
and judges the answer (:meth:`~PolicyDryRun.judge`) exactly as a quote
round does -- the quote by the node's AK over the nonce bound to its NK,
the list replayed into PCR 10 until it reaches the quoted value, entry 0
the boot aggregate of the quoted PCRs 0-9 -- but instead of stopping at
the first entry the candidate refuses, it lists every one
(:func:`verifier.protocol.ima.evaluate`). A list sent in parts (``more``)
is asked for again from where it stopped, each part under a new nonce,
and the quote with the last part must cover them all.

It holds no state of the node and changes none: it is built per check
from the node's AK alone, and its outcome is a
:class:`~verifier.protocol.messages.policy_check.NodeCheck`. It fails
closed: evidence that does not verify, parse or replay is an ``error``
naming the reason, never a ``pass``.
"""

from __future__ import annotations

from verifier.protocol.errors import EvidenceError, MalformedError
from verifier.protocol.evidence import BOOT_PCRS, ima_evidence
from verifier.protocol.ima import (
    Failure,
    ImaEntry,
    ReplayState,
    RuntimePolicy,
    check_boot_aggregate,
    evaluate,
    replay,
    replay_to_pcr,
)
from verifier.protocol.ima.log import IMA_PCR
from verifier.protocol.messages.policy_check import NodeCheck
from verifier.protocol.messages.quote import QuoteAnswer, QuoteRequest
from verifier.protocol.policy import PcrPolicy
from verifier.protocol.quote import (
    AttestationKey,
    ClockState,
    QuoteVerdict,
    bind_nonce,
    verify_quote,
)

__all__ = ["DRY_RUN_PCRS", "MAX_DRY_RUN_ROUNDS", "PolicyDryRun"]

#: The PCRs a dry run asks for: the boot PCRs (the boot aggregate) and 10.
DRY_RUN_PCRS = (*BOOT_PCRS, IMA_PCR)
#: The most quotes one dry run takes (a list sent in that many parts).
MAX_DRY_RUN_ROUNDS = 16
_NO_PCR_POLICY = PcrPolicy({})  # the candidate judges the list, not PCRs
_MAX_ERROR = 300


class PolicyDryRun:
    """Judges one node's whole IMA list against a candidate policy.

    Args:
        uuid: the node.
        ak: its attestation key, as the registrar vouched for it.
        policy: the candidate runtime policy.
        max_rounds: the most quotes to take (a list sent in parts).
    """

    def __init__(
        self,
        uuid: str,
        ak: AttestationKey,
        policy: RuntimePolicy,
        max_rounds: int = MAX_DRY_RUN_ROUNDS,
    ) -> None:
        self.uuid = uuid
        self._ak = ak
        self._policy = policy
        self._max_rounds = max_rounds
        self._replayed = ReplayState()
        self._failures: list[Failure] = []
        self._clock: ClockState | None = None
        self._rounds = 0
        self._first: ImaEntry | None = None  # entry 0, once received

    def request(self, nonce: bytes) -> QuoteRequest:
        """The next quote to ask for: PCRs 0-10 over ``nonce`` (fresh for
        each request), the list from the first entry not received yet.

        Raises:
            QuoteRequestError: ``nonce`` is not 8..32 bytes.
        """
        return QuoteRequest(nonce, DRY_RUN_PCRS, False, self._replayed.count)

    def judge(self, request: QuoteRequest, answer: object) -> NodeCheck | None:
        """Judge the node's answer to ``request`` (made by :meth:`request`).

        Never raises: an answer that does not parse is an ``error`` with
        the reason ``malformed``, evidence that fails a check one with
        the check's reason (``nonce_mismatch``, ``signature_invalid``,
        ``ima_pcr_mismatch``, ``ima_boot_aggregate``, ...), an error of
        the checks themselves ``check_error``.

        Args:
            request: what was asked.
            answer: the JSON answer, an already parsed one, or the
                :class:`MalformedError` of an answer that was not JSON.

        Returns:
            The outcome, or None when the node sent its list in parts and
            must be asked again (:meth:`request`).
        """
        try:
            if isinstance(answer, MalformedError):
                raise answer
            if not isinstance(answer, QuoteAnswer):
                answer = QuoteAnswer.from_dict(answer)
            return self._judge(request, answer)
        except EvidenceError as exc:
            return self.error(exc.reason, exc.detail)
        except MalformedError as exc:
            return self.error("malformed", str(exc))
        except Exception as exc:  # fail closed: a check that breaks is no pass
            return self.error("check_error", f"{type(exc).__name__}: {exc}")

    def error(self, reason: str, detail: str) -> NodeCheck:
        """An ``error`` outcome (e.g. ``agent_unreachable`` from the
        caller, which does the I/O)."""
        return NodeCheck.error_of(self.uuid, reason, detail[:_MAX_ERROR])

    def _verify(self, request: QuoteRequest, answer: QuoteAnswer) -> QuoteVerdict:
        quoted = verify_quote(
            answer.quote,
            ak=self._ak,
            qualifying_data=bind_nonce(request.nonce, answer.nk),
            policy=_NO_PCR_POLICY,
            previous_clock=self._clock,
        )
        missing = [i for i in request.pcrs if i not in quoted.pcr_values]
        if missing:
            raise EvidenceError("pcr_selection", f"PCRs {missing} were not quoted")
        clock, previous = quoted.clock, self._clock
        if previous is not None and (clock.reset_count, clock.restart_count) != (
            previous.reset_count,
            previous.restart_count,
        ):
            raise EvidenceError(
                "node_rebooted",
                "the node's TPM was reset or restarted during the check; "
                "check it again",
            )
        self._clock = clock
        return quoted

    def _judge(self, request: QuoteRequest, answer: QuoteAnswer) -> NodeCheck | None:
        quoted = self._verify(request, answer)
        if answer.ima_error is not None:
            raise EvidenceError(
                "ima_log_unavailable",
                f"the node could not send it: {answer.ima_error[:_MAX_ERROR]}",
            )
        if answer.ima is None:
            raise MalformedError("runtime evidence", "'ima' must be an object")
        evidence = ima_evidence(answer.ima)
        start = self._replayed
        if evidence.first != start.count:
            raise EvidenceError(
                "ima_log_gap",
                f"entries start at {evidence.first}, expected {start.count}",
            )
        self._rounds += 1
        if start.count == 0 and evidence.entries:
            self._first = evidence.entries[0]
        if evidence.more:  # proven by the quote that comes with the last part
            self._replayed = replay(start, evidence.entries)
            self._failures += evaluate(self._policy, evidence.entries, start.count)
            if self._rounds >= self._max_rounds:
                raise EvidenceError(
                    "evidence_incomplete",
                    f"the list was still incomplete after {self._max_rounds} quotes",
                )
            return None
        pcrs = quoted.pcr_values
        end = replay_to_pcr(start, evidence.entries, pcrs[IMA_PCR])
        covered = evidence.entries[: end.count - start.count]
        if end.count == 0 or self._first is None:
            raise EvidenceError(
                "ima_log_empty", "the node's IMA list is empty: nothing to judge"
            )
        # entry 0 may have come in an earlier part: the boot PCRs are the
        # same in every quote of one boot (the clock says it is one boot)
        check_boot_aggregate(self._first, [pcrs[i] for i in BOOT_PCRS])
        self._failures += evaluate(self._policy, covered, start.count)
        self._replayed = end
        return NodeCheck.judged(self.uuid, end.count, self._failures)
