"""Writing a node's state change together with its signed event.

Every change of a node's state is written ahead of entering it. A change
that takes a node out of what the verifier vouches for carries a signed
event, staged in the outbox in the same database transaction as the state
(:mod:`verifier.attest.store`), so consumers learn of it exactly when it is
committed, and only once when several verifiers race:

- to ``revoked``: a ``node.revoked`` event, always;
- to ``failed`` from any other state: a ``node.failed`` event
  (doc/source/admin/fail-closed.rst); staying failed writes none;
- to ``unreachable`` from any other state: a ``node.unreachable`` event;
- from ``failed`` or ``unreachable`` back to a trusted state (a good
  quote): a ``node.recovered`` event, so consumers learn the way back too.

Polling (:mod:`verifier.attest.pull`), push (:mod:`verifier.attest.push`),
the release of V (:mod:`verifier.attest.release`) and the API's commands
all go through :class:`TransitionWriter`; it calls only down, into the
store, the outbox pump and the CP-ABE authority.

Each of these changes, and a node's first ``attested``, also stages its
entry of the attestation log in the same transaction (:mod:`verifier.tlog`);
the log's sequencer appends it to the tree later.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cryptography.hazmat.primitives.asymmetric import ed25519

from verifier.attest.delivery import OutboxPump
from verifier.attest.node import LiveNode, NodeState
from verifier.attest.store import NodeStore
from verifier.common import metrics
from verifier.notify.outbox import make_event
from verifier.protocol.attestation import AttestationRules, Transition, Verdict
from verifier.protocol.events import (
    NODE_FAILED,
    NODE_RECOVERED,
    NODE_REVOKED,
    NODE_UNREACHABLE,
)
from verifier.tlog import ATTESTED, Staged

if TYPE_CHECKING:  # CP-ABE is the abe extra
    from verifier.attest.abe_keys import AbeAuthority

__all__ = ["TransitionWriter", "event_kind", "log_kind"]

LOG = logging.getLogger(__name__)


_OUT = {NodeState.FAILED: NODE_FAILED, NodeState.UNREACHABLE: NODE_UNREACHABLE}


def log_kind(old: NodeState, new: NodeState) -> str | None:
    """The attestation log's entry a change from ``old`` to ``new`` (not
    revoked) writes: those of its event, and ``attested`` when a node
    becomes trusted for the first time (V released: ``attested``)."""
    kind = event_kind(old, new)
    if kind is not None:
        return kind.removeprefix("node.")
    if new == NodeState.ATTESTED and old != NodeState.ATTESTED:
        return ATTESTED
    return None


def event_kind(old: NodeState, new: NodeState) -> str | None:
    """The event a change from ``old`` to ``new`` (not revoked) carries:
    leaving what the verifier vouches for, or coming back to it."""
    if new in _OUT:
        return _OUT[new] if old != new else None
    if old in _OUT and new != NodeState.REVOKED:
        return NODE_RECOVERED
    return None


class TransitionWriter:
    """Writes verdicts' transitions and their signed events.

    Args:
        store: the nodes' table (and the outbox beside it).
        signing_key: signs the events.
        clock: wall clock (seconds).
        rules: the operator's rules (for rounds without an answer).
        pump: woken when an event was committed, to deliver it at once.
        abe: told of revocations (the node's CP-ABE keys; None: off).
        log_written: called when an attestation log entry was committed
            (wakes the log's sequencer).
    """

    def __init__(
        self,
        store: NodeStore,
        signing_key: ed25519.Ed25519PrivateKey,
        clock: Callable[[], float],
        rules: AttestationRules,
        pump: OutboxPump,
        abe: AbeAuthority | None = None,
        log_written: Callable[[], None] | None = None,
    ) -> None:
        self._store = store
        self._signing_key = signing_key
        self._clock = clock
        self.rules = rules
        self._pump = pump
        self._abe = abe
        self._log_written = log_written or (lambda: None)

    def _committed(self, uuid: str, revoked: bool) -> None:
        """An event of ``uuid`` was committed (a revocation: ``revoked``)."""
        self._pump.wake()
        self._log_written()
        if revoked and self._abe is not None:
            self._abe.revoked(uuid)

    def missed(self, node: LiveNode, detail: str) -> None:
        """Count one round of ``node`` without an answer (a transport
        failure, or no pushed evidence by its deadline) and act on it."""
        verdict = node.transport_failed(detail, self.rules, self._clock())
        LOG.debug("Node %s unreachable (%d): %s", node.uuid, node.unreachable, detail)
        if verdict.transition is not None:
            LOG.warning(
                "Node %s missed %d rounds: %s", node.uuid, node.unreachable, detail
            )
        self.act(node, verdict)

    def act(self, node: LiveNode, verdict: Verdict, **extra: Any) -> None:
        """Write the verdict's transition (and ``extra`` columns), then
        enter it; a node revoked meanwhile by another verifier stops."""
        change = verdict.transition
        if change is None:
            return
        if change.state == NodeState.REVOKED:
            self.revoke_live(node, change)
            return
        event, log = None, None
        kind = event_kind(node.state, change.state)
        if kind is not None:  # consumers learn that our word changed
            reason = change.reason or kind.removeprefix("node.")
            detail = change.detail or f"was {node.state}: {node.failure_reason}"
            event = make_event(
                self._signing_key, node.uuid, reason, detail, self._clock(), kind
            )
            log = Staged(kind.removeprefix("node."), reason, detail, event.event.id)
        elif log_kind(node.state, change.state) == ATTESTED:
            log = Staged(ATTESTED, change.reason or ATTESTED, change.detail)
        if self._store.update_state(node, change, event, log, **extra):
            node.apply(change)
            if event is None and log is not None:
                self._log_written()
            if event is not None:
                LOG.warning(
                    "Node %s %s (%s); event %s",
                    node.uuid,
                    change.state,
                    event.event.reason,
                    event.event.id,
                )
                self._committed(node.uuid, False)
                metrics.transition(event.event.type, change.reason)
        else:  # revoked (or deleted) by another verifier meanwhile
            node.revoked_elsewhere()

    def revoke_live(
        self, node: LiveNode, change: Transition, kind: str = NODE_REVOKED
    ) -> None:
        """Revoke a node this process attests (its hot state written too),
        with an event of ``kind`` (``node.revoked``, or
        ``node.host_untrusted`` when its compute host was found untrusted)."""
        reason, detail = change.reason or "revoked", change.detail
        signed = make_event(
            self._signing_key, node.uuid, reason, detail, self._clock(), kind
        )
        log = kind.removeprefix("node.")
        first = self._store.revoke(node.uuid, f"{reason}: {detail}", signed, node, log)
        node.apply(change)
        if first:
            LOG.warning(
                "Node %s %s (%s); event %s", node.uuid, log, reason, signed.event.id
            )
            self._committed(node.uuid, True)
            metrics.transition(kind, change.reason)

    def revoke_stored(
        self, uuid: str, reason: str, detail: str, kind: str = NODE_REVOKED
    ) -> None:
        """Revoke a node another process attests (or none): in the
        database, once, whoever else races (an event of ``kind``)."""
        signed = make_event(
            self._signing_key, uuid, reason, detail, self._clock(), kind
        )
        failure = f"{reason}: {detail}"
        if self._store.revoke(uuid, failure, signed, None, kind.removeprefix("node.")):
            self._committed(uuid, True)
            metrics.transition(kind, reason)
