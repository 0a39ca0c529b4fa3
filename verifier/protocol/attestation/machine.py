"""The per-node attestation state machine: :class:`NodeAttestation` (see
:mod:`verifier.protocol.attestation`)."""

from __future__ import annotations

import functools

from verifier.protocol.attestation.verdict import (
    Action,
    AttestationRules,
    HotState,
    NodeState,
    Transition,
    Verdict,
)
from verifier.protocol.errors import EvidenceError, MalformedError
from verifier.protocol.evidence import (
    BOOT_PCRS,
    MOK_PCR,
    check_ima,
    check_measured_boot,
    extend_ima,
    ima_evidence,
    is_legacy_log,
)
from verifier.protocol.ima import ReplayState, RuntimePolicy
from verifier.protocol.ima.log import IMA_PCR, ImaEntry
from verifier.protocol.mb import MeasuredBootPolicy
from verifier.protocol.messages.quote import QuoteAnswer, QuoteRequest
from verifier.protocol.policy import PcrPolicy
from verifier.protocol.quote import (
    AttestationKey,
    ClockState,
    QuoteVerdict,
    bind_nonce,
    verify_quote,
)

__all__ = ["NodeAttestation"]

#: How much of an agent's error message a verdict repeats.
_MAX_ERROR = 300
_NOTHING_REPLAYED = ReplayState()  # shared: frozen
_SHA256 = ("sha256",)
_WITH_SHA1 = ("sha256", "sha1")


#: The states a good quote brings a node back from.
_SET_BACK = frozenset({NodeState.FAILED, NodeState.UNREACHABLE})
#: The states a good quote makes a node with nothing (more) to release
#: attested from: V delivered, or a node enrolled without V (a compute
#: host, :mod:`verifier.protocol.attestation.hosts`).
_FIRST_TRUST = frozenset({NodeState.REGISTERED, NodeState.BOOTSTRAPPING})


def _quoted_pcrs(
    policy_pcrs: tuple[int, ...], ima: bool, mb: MeasuredBootPolicy | None
) -> tuple[int, ...]:
    mok = mb is not None and mb.chain is not None and bool(mb.chain.mok)
    return _selection(policy_pcrs, ima, mb is not None, mok)


@functools.lru_cache(maxsize=4096)
def _selection(
    policy_pcrs: tuple[int, ...], ima: bool, mb: bool, mok: bool
) -> tuple[int, ...]:
    # one shared tuple per distinct selection, not one per node
    pcrs = set(policy_pcrs)
    if ima:
        pcrs.add(IMA_PCR)
    if mb:
        pcrs.update(BOOT_PCRS)
    if mok:
        pcrs.add(MOK_PCR)  # shim's MOK lists
    return tuple(sorted(pcrs))


def _agent_error(error: str | None, reason: str) -> None:
    if error is not None:
        shown = error[:_MAX_ERROR]
        raise EvidenceError(reason, f"the node could not send it: {shown}")


class NodeAttestation:
    """The attestation state of one node (see the module docstring).

    Args:
        uuid: the node.
        policy: its PCR policy (may be empty with a runtime or measured-boot
            policy).
        ak: its attestation key, as the registrar vouched for it.
        state: its state as last written.
        runtime: its IMA runtime policy (shared), or None.
        mb: its measured-boot policy (shared), or None.
        clock: the TPM clock of its last accepted quote.
        ima: the IMA replay state of its current boot.
        last_attested_at: when its last good quote was judged.
        quotes_verified: its good quotes so far.
        failure_reason: why it failed or was revoked.
        v_released: V was delivered to it.
    """

    __slots__ = (
        "_banks",
        "_clock",
        "_failure_reason",
        "_ima",
        "_ima_first",
        "_last_attested_at",
        "_mb_boot",
        "_pcrs",
        "_quotes_verified",
        "_rounds",
        "_silent_since",
        "_state",
        "_unreachable",
        "_v_released",
        "ak",
        "dirty",
        "mb",
        "policy",
        "runtime",
        "uuid",
    )

    def __init__(
        self,
        uuid: str,
        policy: PcrPolicy,
        ak: AttestationKey,
        *,
        state: NodeState = NodeState.REGISTERED,
        runtime: RuntimePolicy | None = None,
        mb: MeasuredBootPolicy | None = None,
        clock: ClockState | None = None,
        ima: ReplayState | None = None,
        last_attested_at: float | None = None,
        quotes_verified: int = 0,
        failure_reason: str | None = None,
        v_released: bool = False,
    ) -> None:
        self.uuid = uuid
        self.policy = policy
        self.ak = ak
        self.runtime = runtime
        self.mb = mb
        self._state = state
        self._clock = clock
        self._ima = ima if ima is not None else _NOTHING_REPLAYED
        # entry 0 of a list sent in parts, checked by the quote of the last
        self._ima_first: ImaEntry | None = None
        self._last_attested_at = last_attested_at
        self._quotes_verified = quotes_verified
        self._failure_reason = failure_reason
        self._v_released = v_released
        self._unreachable = 0
        self._silent_since: float | None = None  # first unanswered round
        self._rounds = 0
        self._mb_boot: int | None = None  # reset count of the boot whose log passed
        #: the banks quoted: sha1 too once the node showed a legacy SHA-1
        #: firmware log or a sha1 IMA boot aggregate (issue 32)
        self._banks: tuple[str, ...] = _SHA256
        self._pcrs = _quoted_pcrs(policy.pcrs, runtime is not None, mb)
        #: the hot state changed since it was last written behind; whoever
        #: writes it (:meth:`snapshot`) clears this
        self.dirty = False

    # -- what the caller reads ----------------------------------------------

    @property
    def state(self) -> NodeState:
        return self._state

    @property
    def failure_reason(self) -> str | None:
        return self._failure_reason

    @property
    def v_released(self) -> bool:
        return self._v_released

    @property
    def clock(self) -> ClockState | None:
        return self._clock

    @property
    def ima(self) -> ReplayState:
        return self._ima

    @property
    def mb_boot(self) -> int | None:
        """The TPM reset count of the boot whose firmware log passed."""
        return self._mb_boot

    @property
    def last_attested_at(self) -> float | None:
        return self._last_attested_at

    @property
    def quotes_verified(self) -> int:
        return self._quotes_verified

    @property
    def unreachable(self) -> int:
        """Rounds in a row the node did not answer."""
        return self._unreachable

    @property
    def quoted_pcrs(self) -> tuple[int, ...]:
        """The PCRs asked for: the PCR policy's, plus 10 for IMA and 0-9
        for measured boot."""
        return self._pcrs

    def snapshot(self) -> HotState:
        """The hot state to write behind."""
        return HotState(
            self._last_attested_at,
            self._quotes_verified,
            self._clock,
            self._ima if self.runtime is not None else None,
        )

    # -- inputs ----------------------------------------------------------------

    def request(self, nonce: bytes) -> QuoteRequest:
        """What to ask the node for next: its quote of :attr:`quoted_pcrs`
        with ``nonce`` (and its CSR until V is released), the IMA entries
        after those already replayed, and its firmware log once per boot.

        Raises:
            QuoteRequestError: ``nonce`` is not 8..32 bytes.
        """
        ima_from = self._ima.count if self.runtime is not None else None
        mb = False
        if self.mb is not None:
            boot = self._clock.reset_count if self._clock is not None else None
            mb = self._mb_boot is None or self._mb_boot != boot
        return QuoteRequest(
            nonce, self._pcrs, not self._v_released, ima_from, mb, self._banks
        )

    def judge(
        self,
        request: QuoteRequest,
        answer: object,
        now: float,
        rules: AttestationRules,
    ) -> Verdict:
        """Judge the node's answer to ``request`` (made by :meth:`request`):
        its quote (bound to its transport key NK, and to its CSR when asked)
        and its runtime evidence. Advances the clock and the IMA replay.

        Never raises: whatever fails (an answer that is not an object or
        does not parse, evidence that fails a check, an error of the checks
        themselves) is a :attr:`Action.REVOKE` verdict naming the reason
        (``malformed``, the failed check's, ``check_error``).

        Args:
            request: what was asked (its nonce, and whether the CSR was).
            answer: the JSON answer, an already parsed one, or the
                :class:`MalformedError` of an answer that was not JSON.
            now: the current time (seconds), kept as the attestation time.
            rules: the operator's rules.

        Returns:
            ``RELEASE_V`` (first good quote), ``WAIT`` (good),
            ``ASK_AGAIN`` (good so far; evidence incomplete) or ``REVOKE``.
        """
        if self._state is NodeState.REVOKED:
            return Verdict(Action.STOP)
        try:
            if isinstance(answer, MalformedError):
                raise answer
            if not isinstance(answer, QuoteAnswer):
                answer = QuoteAnswer.from_dict(answer)
            return self._judge(request, answer, now, rules)
        except EvidenceError as exc:
            return self._revoked(exc.reason, exc.detail)
        except MalformedError as exc:
            return self._revoked("malformed", str(exc))
        except Exception as exc:  # fail closed: a check that breaks fails
            return self._revoked("check_error", f"{type(exc).__name__}: {exc}")

    def transport_failed(
        self, detail: str, rules: AttestationRules, now: float | None = None
    ) -> Verdict:
        """The node did not answer a request (``detail`` says why) at time
        ``now`` (None: no escalation is judged).

        An unanswered round hides nothing: PCRs and the IMA list are
        cumulative, so a node that answers again in the same boot proves
        everything it ran meanwhile, and a rebooted one proves its new
        boot. Silence costs detection latency, not evidence; only silence
        that lasts is a reason to cut a node off.

        Returns:
            ``WAIT``; after ``rules.max_unreachable`` rounds in a row
            ``FAIL`` with the transition to ``unreachable`` (``REVOKE``
            with ``rules.revoke_unreachable``); ``REVOKE`` with the reason
            ``unreachable_timeout`` once the node has been silent for
            ``rules.unreachable_timeout`` seconds. An unreachable (or
            failed) node stays so, with a transition carrying the latest
            reason when it changed.
        """
        if self._state is NodeState.REVOKED:
            return Verdict(Action.STOP)
        self._unreachable += 1
        self._rounds = 0
        if self._silent_since is None and now is not None:
            self._silent_since = now
        silent = self._silent_for(now)
        timeout = rules.unreachable_timeout
        if silent is not None and timeout is not None and silent >= timeout:
            return self._revoked(
                "unreachable_timeout", f"no answer for {silent:.0f} s: {detail}"
            )
        gone = Transition(NodeState.UNREACHABLE, "unreachable", detail)
        if self._state in (NodeState.UNREACHABLE, NodeState.FAILED):
            if self._unreachable < rules.max_unreachable:
                return Verdict(Action.WAIT)
            if gone.failure_reason == self._failure_reason:
                return Verdict(Action.WAIT)
            return Verdict(Action.WAIT, gone)
        if self._unreachable < rules.max_unreachable:
            return Verdict(Action.WAIT)
        if rules.revoke_unreachable:
            return self._revoked("unreachable", detail)
        return Verdict(Action.FAIL, gone)

    def _silent_for(self, now: float | None) -> float | None:
        """Seconds since the node last proved itself (its last good quote,
        or its first unanswered round if it never passed one)."""
        if now is None:
            return None
        since = self._last_attested_at
        if since is None:
            since = self._silent_since
        return None if since is None else now - since

    def round_failed(self, reason: str, detail: str) -> Verdict:
        """A round could not be completed: an error while obtaining or
        judging the evidence that is neither an answer to judge nor a
        transport failure (a defect, of the verifier or of what the agent
        sent, that broke the round). Fail closed: the node is failed at
        once (no grace rounds), and polled again; a good quote brings it
        back.

        Returns:
            ``FAIL`` with the transition to ``failed`` naming ``reason``;
            ``WAIT`` with it (the latest reason) when already failed;
            ``STOP`` when revoked.
        """
        if self._state is NodeState.REVOKED:
            return Verdict(Action.STOP)
        self._rounds = 0
        failed = Transition(NodeState.FAILED, reason, detail[:_MAX_ERROR])
        if self._state is NodeState.FAILED:
            if failed.failure_reason == self._failure_reason:
                return Verdict(Action.WAIT)
            return Verdict(Action.WAIT, failed)
        return Verdict(Action.FAIL, failed)

    def v_delivered(self) -> Verdict:
        """V (and the identity certificate) reached the node.

        Returns:
            ``WAIT`` with the transition to ``attested``.
        """
        if self._state is NodeState.REVOKED:
            return Verdict(Action.STOP)
        self._v_released = True
        attested = Transition(NodeState.ATTESTED, v_released=True)
        return Verdict(Action.WAIT, attested)

    def revoke(self, reason: str, detail: str) -> Verdict:
        """Revoke the node for a reason found outside the quote (its tenant
        asks, its CSR is refused, ...).

        Returns:
            ``REVOKE``, or ``STOP`` if it is revoked already.
        """
        if self._state is NodeState.REVOKED:
            return Verdict(Action.STOP)
        return self._revoked(reason, detail)

    def apply(self, transition: Transition) -> None:
        """Enter ``transition``'s state, once it is written. Revocation is
        final: a revoked node stays revoked."""
        if self._state is NodeState.REVOKED:
            return
        self._state = transition.state
        self._failure_reason = transition.failure_reason
        if transition.v_released:
            self._v_released = True

    def use_policies(
        self, runtime: RuntimePolicy | None, mb: MeasuredBootPolicy | None
    ) -> None:
        """Judge from now on with ``runtime`` and ``mb`` (a new version the
        node follows, or one its tenant set). The IMA replay and the
        measured boot already judged stay: entries replayed so far were
        judged by the policy in force then, and the entries after them are
        judged by the new one at the next quote. A runtime policy added
        where there was none starts the replay from the first entry; a
        measured-boot policy judges the firmware log at the node's next
        boot (at once if it had none).

        A quote asked for before the change is judged by the new policies;
        one that lacks what they need (no IMA entries asked for) asks
        again instead of failing."""
        if runtime is None or self.runtime is None:
            self._ima = _NOTHING_REPLAYED  # nothing judged: replay from the start
            self._ima_first = None
        self.runtime = runtime
        self.mb = mb
        self._pcrs = _quoted_pcrs(self.policy.pcrs, runtime is not None, mb)

    def revoked_elsewhere(self) -> None:
        """The stored node is revoked (by another verifier, or its tenant
        through one): stop judging it."""
        self._state = NodeState.REVOKED

    # -- judging ---------------------------------------------------------------

    def _revoked(self, reason: str, detail: str) -> Verdict:
        self._rounds = 0
        return Verdict(Action.REVOKE, Transition(NodeState.REVOKED, reason, detail))

    def _judge(
        self,
        request: QuoteRequest,
        answer: QuoteAnswer,
        now: float,
        rules: AttestationRules,
    ) -> Verdict:
        if not request.csr:
            qualifying = bind_nonce(request.nonce, answer.nk)
        elif answer.csr is None:
            raise MalformedError("agent answer", "'csr' missing")
        else:
            qualifying = bind_nonce(request.nonce, answer.nk, answer.csr)
        quoted = verify_quote(
            answer.quote,
            ak=self.ak,
            qualifying_data=qualifying,
            policy=self.policy,
            previous_clock=self._clock,
        )
        previous, self._clock = self._clock, quoted.clock
        self.dirty = True
        reset = quoted.clock.reset_count
        rebooted = previous is not None and previous.reset_count != reset
        if not self._check_evidence(request, answer, quoted, rebooted):
            self._rounds += 1
            if self._rounds >= rules.max_rounds:
                return self._revoked(
                    "evidence_incomplete",
                    f"runtime evidence still incomplete after {rules.max_rounds}"
                    " quotes",
                )
            return Verdict(Action.ASK_AGAIN)
        return self._passed(request, answer, quoted, now)

    def _check_evidence(
        self,
        request: QuoteRequest,
        answer: QuoteAnswer,
        quoted: QuoteVerdict,
        rebooted: bool,
    ) -> bool:
        """Check the runtime evidence of a verified quote, advancing the IMA
        replay and the measured boot.

        Returns:
            True if the evidence is complete and good; False if another
            round is needed first (the node rebooted and must resend from
            the start, or it sent a long list in parts).

        Raises:
            EvidenceError: naming the failed check (and entry or event).
            MalformedError: evidence that does not parse.
        """
        complete = True
        reset = quoted.clock.reset_count
        if rebooted:
            self._ima = _NOTHING_REPLAYED
            self._ima_first = None
            self._mb_boot = None
        if self.mb is not None and self._mb_boot != reset:
            _agent_error(answer.mb_error, "mb_log_unavailable")
            if answer.mb_log is None:
                complete = False  # asked before the reboot was known
            elif self._ask_sha1(request, quoted, is_legacy_log(answer.mb_log)):
                complete = False  # a legacy SHA-1 log: ask for the sha1 bank
            else:
                check_measured_boot(
                    answer.mb_log, quoted.pcr_values, self.mb, quoted.bank_values
                )
                self._mb_boot = reset
        if self.runtime is not None:
            if request.ima_from is None:
                return False  # asked before a runtime policy was set
            _agent_error(answer.ima_error, "ima_log_unavailable")
            if answer.ima is None:
                raise MalformedError("runtime evidence", "'ima' must be an object")
            evidence = ima_evidence(answer.ima)
            if rebooted and evidence.first != 0:
                return False
            if evidence.more:
                if self._ima.count == 0 and evidence.entries:
                    self._ima_first = evidence.entries[0]
                self._ima = extend_ima(self._ima, evidence, self.runtime)
                return False
            first = self._ima_first
            if self._ima.count == 0 and evidence.entries:
                first = evidence.entries[0]
            sha1 = first is not None and first.digest_algorithm == "sha1"
            if self._ask_sha1(request, quoted, sha1):
                return False  # a sha1 boot_aggregate: ask for the sha1 bank
            self._ima = check_ima(
                self._ima,
                evidence,
                quoted.pcr_values,
                self.runtime,
                self._ima_first,
                quoted.bank_values,
            )
            self._ima_first = None
        return complete

    def _ask_sha1(
        self, request: QuoteRequest, quoted: QuoteVerdict, needed: bool
    ) -> bool:
        """Whether to ask again with the sha1 bank quoted too: the evidence
        ``needed`` it and this quote was not asked over it. A node asked
        over it that still sends no sha1 values (an older agent, a TPM
        without the bank) is judged on sha256 and fails naming why."""
        if not needed or "sha1" in request.banks or "sha1" in quoted.bank_values:
            return False
        self._banks = _WITH_SHA1
        return True

    def _passed(
        self,
        request: QuoteRequest,
        answer: QuoteAnswer,
        quoted: QuoteVerdict,
        now: float,
    ) -> Verdict:
        self._rounds = 0
        self._last_attested_at = now
        self._quotes_verified += 1
        self._unreachable = 0
        self._silent_since = None
        state = self._state
        if request.csr and not self._v_released:
            to = None
            if state is not NodeState.BOOTSTRAPPING:
                to = Transition(NodeState.BOOTSTRAPPING)
            return Verdict(Action.RELEASE_V, to, answer.nk, answer.csr, quoted.attest)
        to = None
        if state in _SET_BACK or (state in _FIRST_TRUST and self._v_released):
            back = NodeState.ATTESTED if self._v_released else NodeState.BOOTSTRAPPING
            to = Transition(back)
        return Verdict(Action.WAIT, to, answer.nk, None, quoted.attest)
