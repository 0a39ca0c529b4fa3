"""Push attestation in the verifier service: nodes enrolled with ``mode:
push`` are not polled; their agents open a TPM session, ask for
challenges and post evidence (:mod:`verifier.protocol.push`), which is
judged by the same :class:`~verifier.protocol.attestation.NodeAttestation`
and acted on by the same write-ahead path as a polled answer
(:class:`~verifier.attest.transitions.TransitionWriter`: state changes,
revocations with their signed events, failures with theirs).

The differences from polling are only where the I/O goes:

* V and the identity certificate travel in the answer to the first good
  evidence, not in a ``POST /v1/keys/v`` to the agent; they count as
  delivered (the node is ``attested``) only once a later post of the agent
  says it holds V (``v_held``), and are sent again with each good evidence
  until then, so an answer lost on the way does not strand the node;
* a deadline replaces the transport error: the quote scheduler still
  visits each push node every interval, and a node that posted no good
  evidence since its deadline counts one unreachable round
  (:meth:`NodeAttestation.transport_failed`), so after
  ``max_unreachable`` of them it is failed (or revoked) with its signed
  event, exactly as an agent that stopped answering polls.

Called by the push endpoint (:mod:`verifier.api.push_app`) and, for
deadlines, by :mod:`verifier.attest.rounds`; calls only down.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from verifier.attest.node import LiveNode, NodeState
from verifier.attest.push_store import PushStore
from verifier.attest.registry import LiveNodes
from verifier.attest.relay import TenantRelay, revoked_error
from verifier.attest.release import ShareRelease
from verifier.attest.transitions import TransitionWriter
from verifier.common import metrics
from verifier.exceptions import ConflictError
from verifier.protocol.attestation import Action, AttestationMode, Verdict
from verifier.protocol.messages.abe import AbeKeyDelivery
from verifier.protocol.messages.push import (
    ChallengeMessage,
    EvidencePost,
    EvidenceResult,
    SessionGrant,
    SessionNonce,
    SessionProof,
)
from verifier.protocol.messages.shares import ShareV
from verifier.protocol.push import PushError, PushLedger, PushRules, session_digest
from verifier.protocol.tpm import TpmAttest

if TYPE_CHECKING:  # CP-ABE is the abe extra
    from verifier.attest.abe_keys import AbeAuthority

__all__ = ["PushAttestation"]

LOG = logging.getLogger(__name__)
_NONCE_BYTES = 20


class PushAttestation:
    """The push side of one verifier process.

    Args:
        nodes: the live nodes.
        transitions: acts on verdicts (the write-ahead path, the rules).
        release: makes V for a node that passed.
        relay: the tenants' identity asks and U on their way to agents.
        abe: issues CP-ABE keys after good evidence (None: off).
        rules: the push limits.
        interval: seconds between two evidence posts of a node enrolled
            without its own interval (the verifier's quote interval).
        clock: wall clock (seconds).
        random: makes nonces, challenge ids and session tokens.
        store: the shared store of sessions and relay state (None: this
            process's memory only).
        session_key: the deployment's session-nonce key
            (:func:`~verifier.attest.push_store.session_key`; None: a
            random one, good for this process only).
        batched: told of each good quote of a node (its TPMS_ATTEST): the
            batched deep quote of its compute host
            (:meth:`verifier.attest.host_batches.HostBatches.guest_passed`).
    """

    def __init__(
        self,
        nodes: LiveNodes,
        transitions: TransitionWriter,
        release: ShareRelease,
        relay: TenantRelay,
        abe: AbeAuthority | None,
        rules: PushRules,
        interval: float,
        clock: Callable[[], float],
        random: Callable[[int], bytes] = os.urandom,
        store: PushStore | None = None,
        session_key: bytes | None = None,
        batched: Callable[[str, TpmAttest], None] | None = None,
    ) -> None:
        self._nodes = nodes
        self._batched = batched
        self._transitions = transitions
        self._release = release
        self._abe = abe
        self._store = store
        self.ledger = PushLedger(rules, session_key or random(32))
        self.rules = rules
        self.interval = interval
        self._clock = clock
        self._random = random
        self._due: dict[str, float] = {}  # uuid -> deadline of good evidence
        #: V sent, not yet acknowledged: uuid -> the identity cert sent with it
        self._v_sent: dict[str, str | None] = {}
        #: the tenants' identity asks and U on their way to push agents
        self.relay = relay

    def interval_of(self, node: LiveNode) -> float:
        """Seconds between two evidence posts of ``node``: its own interval
        (its verification class) or the verifier's."""
        return self.interval if node.interval is None else node.interval

    def _grace(self, node: LiveNode) -> float:
        # an agent is given its challenge's lifetime on top of the interval
        return self.interval_of(node) + self.rules.challenge_ttl

    def _node(self, uuid: str) -> LiveNode:
        """The live push node ``uuid``.

        Raises:
            NotFoundError: not enrolled (or attested by another verifier).
            ConflictError: ``not_push_mode`` or ``revoked``.
        """
        node = self._nodes.live(uuid)
        if node.mode is not AttestationMode.PUSH:
            raise ConflictError(
                "not_push_mode", f"node {node.uuid} is attested by polling"
            )
        if node.state == NodeState.REVOKED:
            raise revoked_error(node)
        return node

    # -- sessions ------------------------------------------------------------

    def open_session(self, uuid: str) -> SessionNonce:
        """A fresh nonce for ``uuid``'s agent to quote with its AK."""
        node = self._node(uuid)
        nonce, expires = self.ledger.session_nonce(node.uuid, self._clock())
        metrics.push_session("opened")
        return SessionNonce(nonce, node.quoted_pcrs, expires)

    def prove_session(self, uuid: str, proof: SessionProof) -> SessionGrant:
        """Open a session if ``proof`` is a quote by the node's activated AK
        over its session nonce.

        Raises:
            PushError: as :meth:`PushLedger.prove_session`.
        """
        node = self._node(uuid)
        token = self._random(32).hex()
        expires = self.ledger.prove_session(
            node.uuid, proof.expires_at, node.ak, proof.quote, token, self._clock()
        )
        if self._store is not None:  # any process, and a restart, honour it
            self._store.save_session(session_digest(token), node.uuid, expires)
        LOG.info("Node %s opened a push session", node.uuid)
        metrics.push_session("granted")
        return SessionGrant(token, expires, self.interval_of(node))

    # -- challenges and evidence -------------------------------------------------

    def challenge(self, uuid: str, token: str) -> ChallengeMessage:
        """The node's next challenge.

        Raises:
            PushError: a bad session, or ``too_frequent``.
        """
        node = self._node(uuid)
        now = self._clock()
        self._session(token, node.uuid, now)
        return self._issue(node, now)

    def _session(self, token: str, uuid: str, now: float) -> None:
        """Check ``token`` is a live session of ``uuid``; a session this
        process does not hold is looked up in the shared store (opened
        before a restart, or by another process of the deployment).

        Raises:
            PushError: as :meth:`PushLedger.session_node`.
        """
        try:
            self.ledger.session_node(token, uuid, now)
            return
        except PushError as exc:
            if exc.code != "no_session" or self._store is None:
                raise
            digest = session_digest(token)
            found = self._store.find_session(digest)
            if found is None:
                raise
        self.ledger.adopt_session(digest, *found)
        self.ledger.session_node(token, uuid, now)

    def _issue(
        self, node: LiveNode, now: float, ahead: bool = False
    ) -> ChallengeMessage:
        request = node.request(self._random(_NONCE_BYTES))
        challenge_id = self._random(16).hex()
        challenge = self.ledger.issue(node.uuid, challenge_id, request, now, ahead)
        identity = self.relay.carry(node.uuid, challenge.id)
        return ChallengeMessage(challenge.id, request, challenge.expires_at, identity)

    def evidence(
        self, uuid: str, token: str, post: EvidencePost, size: int
    ) -> EvidenceResult:
        """Judge evidence posted for a challenge, act on the verdict, and
        answer with the node's state (and V after its first good evidence,
        or a follow-up challenge when the evidence is incomplete).

        Raises:
            PushError: refused before judging (the node is unchanged).
        """
        started = time.perf_counter()
        node = self._node(uuid)
        now = self._clock()
        self._session(token, node.uuid, now)
        challenge = self.ledger.take(node.uuid, post.challenge, size, now)
        transitions = self._transitions
        verdict = node.judge(challenge.request, post.evidence, now, transitions.rules)
        metrics.judged("push", verdict, started)
        if not verdict and verdict.transition is not None:
            LOG.warning(
                "Node %s failed attestation (push): %s",
                node.uuid,
                verdict.transition.failure_reason,
            )
        transitions.act(node, verdict)
        if self._batched is not None and verdict and verdict.attest is not None:
            self._batched(node.uuid, verdict.attest)
        self.relay.received(node, post)
        share, follow = None, None
        if verdict.action in (Action.WAIT, Action.RELEASE_V, Action.ASK_AGAIN):
            self._due[node.uuid] = now + self._grace(node)
        if verdict.action is Action.ASK_AGAIN:
            self.ledger.follow_up(node.uuid)
            follow = self._issue(node, now)
        elif verdict.action is Action.RELEASE_V:
            share = self._release_v(node, verdict, post.v_held)
        abe = self._abe_key(node, verdict)
        upcoming, u_share = None, None
        interval = self.interval_of(node)
        if node.state != NodeState.REVOKED:
            u_share = self.relay.deliver_u(node.uuid)
        if node.state == NodeState.REVOKED:
            self.ledger.forget(node.uuid)
            self._v_sent.pop(node.uuid, None)
            self.drop(node.uuid)
        elif follow is None and interval + 1.0 < self.rules.challenge_ttl:
            # the next challenge rides on this answer: one request per round
            upcoming = self._issue(node, now, ahead=True)
        return EvidenceResult(
            node.state.value, interval, share, follow, abe, upcoming, u_share
        )

    def _abe_key(self, node: LiveNode, verdict: Verdict) -> AbeKeyDelivery | None:
        """The CP-ABE key a node that passed is owed (as polling delivers
        it after each good quote); a failure fails the node, as a polled
        round that breaks does."""
        abe = self._abe
        if abe is None or verdict.attest is None or verdict.nk is None:
            return None
        if node.state == NodeState.REVOKED:
            return None
        try:
            owed = abe.owed(node, verdict.attest, verdict.nk)
        except Exception as exc:  # fail closed, as a broken quote round
            LOG.exception("Node %s: its CP-ABE key could not be made", node.uuid)
            detail = f"{type(exc).__name__}: {exc}"
            failed = node.round_failed("internal_error", detail)
            self._transitions.act(node, failed)
            return None
        if owed is None:
            return None
        delivery, marker = owed
        abe.delivered(node.uuid, marker)  # handed over in the answer
        return delivery

    def _release_v(
        self, node: LiveNode, verdict: Verdict, held: bool | None
    ) -> ShareV | None:
        """V sealed to the quoted NK, with the identity certificate, for the
        answer; None once the agent says it holds the V sent earlier (the
        node is then attested).

        ``held`` is the agent's word (:attr:`EvidencePost.v_held`): until
        it is True, V goes again with each good evidence (the answer that
        carried it may be lost). An agent that does not say (None) is
        taken to have V once it is sent."""
        transitions = self._transitions
        if held and node.uuid in self._v_sent:
            cert = self._v_sent.pop(node.uuid)
            transitions.act(node, node.v_delivered(), identity_cert=cert)
            LOG.info("Node %s attested (push); its agent holds V", node.uuid)
            return None
        share = self._release.share_v(node, verdict)
        if share is None:
            return None
        if held is None:
            transitions.act(node, node.v_delivered(), identity_cert=share.identity_cert)
            LOG.info("Node %s attested (push); V released", node.uuid)
        else:
            self._v_sent[node.uuid] = share.identity_cert
            LOG.info("Node %s: V sent (push), waiting for its agent to say so",
                     node.uuid)  # fmt: skip
        return share

    # -- deadlines -------------------------------------------------------------

    def deadline_round(self, node: LiveNode) -> None:
        """The scheduler's visit of a push node: one unreachable round if
        no good evidence came by its deadline."""
        now = self._clock()
        due = self._due.setdefault(node.uuid, now + self._grace(node))
        if now <= due:
            return
        self._due[node.uuid] = now + self.interval_of(node)  # one round per interval
        last = node.last_attested_at
        since = f"since {last:.0f}" if last is not None else "since enrolment"
        self._transitions.missed(node, f"no evidence pushed {since}")

    def adopted(self, uuid: str, fresh: bool = False) -> None:
        """This process attests ``uuid`` now (its shared relay state; none
        for a ``fresh`` enrolment)."""
        self.relay.adopted(uuid, fresh)

    def drop(self, uuid: str) -> None:
        """The node is revoked or deleted: its sessions and relay state go
        from the shared store too."""
        self.ledger.forget(uuid)
        self.relay.drop(uuid)
        if self._store is not None:
            self._store.forget_sessions(uuid)

    def forget(self, uuid: str) -> None:
        """The node is no longer attested here (the shared store keeps its
        sessions and relay state for the process that attests it)."""
        self.ledger.forget(uuid)
        self.relay.forget(uuid)
        self._due.pop(uuid, None)
        self._v_sent.pop(uuid, None)
