"""The vocabulary of the per-node attestation state machine
(:mod:`verifier.protocol.attestation`): a node's states, the actions and
transitions its verdicts ask for, the operator's rules, the hot state
written behind."""

from __future__ import annotations

import dataclasses
import enum

from verifier.protocol.ima import ReplayState
from verifier.protocol.messages.enrolment import AttestationMode
from verifier.protocol.quote import ClockState
from verifier.protocol.tpm import TpmAttest

__all__ = [
    "Action",
    "AttestationMode",
    "AttestationRules",
    "HotState",
    "NodeState",
    "Transition",
    "Verdict",
]


class NodeState(enum.StrEnum):
    """Where a node is in its life (stored as the value)."""

    #: enrolled at boot, before Nova reported the instance created
    PENDING = "pending"
    #: Nova created the instance; waiting for its agent's activated AK
    CREATED = "created"
    #: enrolled with an activated AK; not quoted successfully yet
    REGISTERED = "registered"
    #: passed a quote; V is being released to it
    BOOTSTRAPPING = "bootstrapping"
    #: V released; passing its quotes
    ATTESTED = "attested"
    #: a round broke (an error neither of the evidence nor of the
    #: transport); kept polling, a good quote brings it back
    FAILED = "failed"
    #: stopped answering (or pushing) for ``max_unreachable`` rounds: not
    #: trusted, kept polling; a good quote that continues its evidence
    #: brings it back (``node.recovered``), and silence past
    #: ``unreachable_timeout`` revokes it
    UNREACHABLE = "unreachable"
    #: final: failed a check or revoked on request
    REVOKED = "revoked"


class Action(enum.Enum):
    """What the caller does next for the node."""

    #: quote it again after the quote interval
    WAIT = "wait"
    #: quote it again at once: the evidence needs another round (a long
    #: IMA list in parts, a reboot noticed after the request was made)
    ASK_AGAIN = "ask_again"
    #: its first good quote: seal V to :attr:`Verdict.nk`, issue its
    #: identity from :attr:`Verdict.csr`, send them, then
    #: :meth:`NodeAttestation.v_delivered`
    RELEASE_V = "release_v"
    #: write the transition to ``failed`` or ``unreachable``; keep quoting it
    FAIL = "fail"
    #: revoke it: write the transition with its signed event
    REVOKE = "revoke"
    #: it is revoked: ask and judge it no more
    STOP = "stop"


@dataclasses.dataclass(frozen=True, slots=True)
class Transition:
    """A state change to persist, then :meth:`NodeAttestation.apply`.

    Attributes:
        state: the new state.
        reason: a stable code for a failure (e.g. ``pcr_policy``), or None.
        detail: a human-readable explanation of the failure.
        v_released: V was delivered (persist it with the state).
    """

    state: NodeState
    reason: str | None = None
    detail: str = ""
    v_released: bool = False

    @property
    def failure_reason(self) -> str | None:
        """The node's stored failure reason: ``"<reason>: <detail>"``."""
        if self.reason is None:
            return None
        return f"{self.reason}: {self.detail}"


@dataclasses.dataclass(slots=True)
class Verdict:
    """The answer of the state machine to one input (one per quote: a
    slotted dataclass, not a frozen one, to keep the check cheap; read it,
    never change it).

    Attributes:
        action: what to do next.
        transition: the state change to persist and apply, if any.
        nk: the node's quoted transport key (good quotes).
        csr: the node's quoted identity CSR (:attr:`Action.RELEASE_V`).
        attest: the verified TPMS_ATTEST (good quotes).
    """

    action: Action
    transition: Transition | None = None
    nk: bytes | None = None
    csr: bytes | None = None
    attest: TpmAttest | None = None

    def __bool__(self) -> bool:
        """False when the node failed, is revoked or is to be revoked."""
        return self.action not in (Action.FAIL, Action.REVOKE, Action.STOP)


@dataclasses.dataclass(frozen=True, slots=True)
class AttestationRules:
    """The operator's rules (from configuration, given by the caller).

    Attributes:
        max_unreachable: unanswered rounds before a node is unreachable
            (or revoked).
        revoke_unreachable: revoke, rather than mark unreachable, a node
            that missed ``max_unreachable`` rounds.
        max_rounds: quote rounds one attestation may take (a long IMA list
            comes in parts) before the node is revoked.
        unreachable_timeout: seconds of silence (since its last good
            quote, or its first unanswered round if it never passed) after
            which an unreachable node is revoked (None: never). Longer
            than a slow reboot: silence must not keep a node's keys for
            ever, and a restart must never cost them.
    """

    max_unreachable: int = 5
    revoke_unreachable: bool = False
    max_rounds: int = 64
    unreachable_timeout: float | None = 900.0


@dataclasses.dataclass(frozen=True, slots=True)
class HotState:
    """What the caller writes behind (:meth:`NodeAttestation.snapshot`).

    Attributes:
        last_attested_at: when the last good quote was judged.
        quotes_verified: good quotes so far.
        clock: the TPM clock of the last accepted quote.
        ima: the IMA replay state (None without a runtime policy).
    """

    last_attested_at: float | None
    quotes_verified: int
    clock: ClockState | None
    ima: ReplayState | None
