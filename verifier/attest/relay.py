"""The tenant's relay to its nodes in the verifier service
(:mod:`verifier.protocol.relay`): the tenant needs no route to the node
and no certificate of its own, in either attestation mode.

* push (the agent opens no port): a tenant's identity ask rides on the
  node's next push challenge, the agent's identity quote comes back with
  its evidence, and U (sealed to NK) rides on the next answer;
* pull (the verifier polls the agent): the verifier asks the agent for
  the identity quote over the tenant's nonce on its own mTLS connection
  (the one it polls with, the agent's certificate pinned from the
  registrar) and forwards U to the agent's ``POST /v1/keys/u`` -- both
  while the tenant's request waits.

Either way the same :class:`~verifier.protocol.relay.RelayLedger` checks
the relay (the node's project only, a quote by the node's AK over the
tenant's nonce, U once), and the tenant checks the quote itself. The
state is the ledger of the process that attests the node.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from verifier.attest.clients import VerifierAgentClient
from verifier.attest.node import LiveNode, NodeState
from verifier.attest.push_store import PushStore
from verifier.attest.registry import LiveNodes
from verifier.exceptions import AgentUnreachableError, ConflictError, RequestError
from verifier.protocol.attestation import AttestationMode
from verifier.protocol.errors import MalformedError
from verifier.protocol.messages.push import EvidencePost
from verifier.protocol.messages.quote import QuoteRequest
from verifier.protocol.messages.relay import IdentityRelayed, URelayStatus
from verifier.protocol.messages.shares import ShareAccepted, ShareU
from verifier.protocol.relay import RelayError, RelayLedger

__all__ = ["TenantRelay"]

LOG = logging.getLogger(__name__)


def revoked_error(node: LiveNode) -> ConflictError:
    """The 409 for a request to a revoked node, naming why it was revoked
    (its stored failure reason, as its signed revocation event gives it:
    a check's code and detail, never key material), so a tenant whose
    enrolment failed at its first quote learns why."""
    reason = node.failure_reason or "no reason recorded"
    return ConflictError("revoked", f"node {node.uuid} is revoked: {reason}")


class TenantRelay:
    """Relays identity quotes and U between tenants and their agents.

    Args:
        nodes: the live nodes (and polled nodes other processes attest).
        agents: the verifier's client for polled agents (its mTLS
            connections, each agent's certificate pinned).
        clock: wall clock (seconds).
        random: makes the ids of the identity fetches from polled agents.
        store: the shared store the ledger is written through to and
            loaded from (None: this process's memory only).
    """

    def __init__(
        self,
        nodes: LiveNodes,
        agents: VerifierAgentClient,
        clock: Callable[[], float],
        random: Callable[[int], bytes] = os.urandom,
        store: PushStore | None = None,
    ) -> None:
        self._nodes = nodes
        self._agents = agents
        self._clock = clock
        self._random = random
        self._store = store
        self._follow = False
        self.ledger = RelayLedger()
        if store is not None:  # what a process before a restart left
            for uuid, state in store.relay_states().items():
                try:
                    self.ledger.load(uuid, state)
                except MalformedError as exc:
                    LOG.warning("Relay state of node %s dropped: %s", uuid, exc)

    def follow_handovers(self) -> None:
        """From now on a node this process takes over (from another
        process of the deployment) is loaded from the store when adopted
        (the state of the first adoptions was loaded at construction)."""
        self._follow = True

    def adopted(self, uuid: str, fresh: bool = False) -> None:
        """This process attests ``uuid`` now: take its relay state from the
        shared store (another process may have left it). A ``fresh`` node
        (enrolled by this process just now, before its tenant could ask
        any process for it) has none: the store is not read (a read on the
        event loop for each node of a boot storm)."""
        if fresh:
            self.ledger.forget(uuid)
            return
        if self._store is None or not self._follow:
            return
        state = self._store.relay_state(uuid)
        self.ledger.forget(uuid)
        if state is not None:
            try:
                self.ledger.load(uuid, state)
            except MalformedError as exc:
                LOG.warning("Relay state of node %s dropped: %s", uuid, exc)

    def drop(self, uuid: str) -> None:
        """The node is revoked or deleted: forget it here and in the store."""
        self.ledger.forget(uuid)
        self._save(uuid)

    def _save(self, uuid: str) -> None:
        """Write the ledger's state of ``uuid`` through to the store."""
        if self._store is not None:
            self._store.save_relay(uuid, self.ledger.export(uuid))

    def _visible(self, uuid: str, scope: str | None) -> LiveNode:
        """The node ``uuid`` if the caller's ``scope`` may see it.

        Raises:
            NotFoundError: not enrolled here (or not adopted yet).
            RelayError: ``wrong_project`` (answered as a node that is not
                enrolled), before anything else about the node shows.
        """
        node = self._nodes.relay_node(uuid)
        if scope is not None and node.project_id != scope:
            raise RelayError("wrong_project", f"node {node.uuid} is not your project's")
        return node

    def _node(self, uuid: str, scope: str | None) -> LiveNode:
        """The live node ``uuid`` of the caller's ``scope``.

        Raises:
            NotFoundError: not enrolled here (or not adopted yet).
            RelayError: ``wrong_project``.
            ConflictError: ``revoked`` (nothing goes to a revoked node).
        """
        node = self._visible(uuid, scope)
        if node.state == NodeState.REVOKED:
            raise revoked_error(node)
        self._refresh(node)
        return node

    def _refresh(self, node: LiveNode) -> None:
        """A polled node's relay state is the shared store's: any process
        of the deployment serves its tenant, one request at a time (a push
        node's is the memory of the process that attests it)."""
        if self._store is None or node.mode is AttestationMode.PUSH:
            return
        state = self._store.relay_state(node.uuid)
        self.ledger.forget(node.uuid)
        if state is not None:
            try:
                self.ledger.load(node.uuid, state)
            except MalformedError as exc:
                LOG.warning("Relay state of node %s dropped: %s", node.uuid, exc)

    # -- the tenant's side -----------------------------------------------------

    async def ask_identity(
        self, uuid: str, scope: str | None, request: QuoteRequest
    ) -> None:
        """Ask node ``uuid`` for an identity quote over the tenant's nonce:
        a push node with its next challenge, a polled node's agent at once.

        Raises:
            RelayError: ``wrong_project``; for a polled node
                ``identity_not_over_nonce`` (its agent answered with a
                quote that is not by its AK over the nonce).
            RequestError: ``agent_unreachable`` (502; a polled node).
        """
        node = self._node(uuid, scope)
        self.ledger.ask_identity(
            node.uuid, node.project_id, scope, request, self._clock()
        )
        if node.mode is AttestationMode.PUSH:
            self._save(node.uuid)
            return
        try:
            await self._fetch_identity(node)
        finally:
            self._save(node.uuid)

    async def _fetch_identity(self, node: LiveNode) -> None:
        """The polled agent's identity quote for the waiting ask, checked by
        the ledger as a pushed one is (by the node's AK, over the nonce)."""
        fetch = f"pull-{self._random(16).hex()}"
        request = self.ledger.carry(node.uuid, fetch, self._clock())
        if request is None:  # pragma: no cover - asked just now
            raise RelayError("not_asked", f"no identity ask for node {node.uuid}")
        # written through before the agent is asked: a take-up of the node
        # meanwhile (the quote loop adopting it reloads its relay state from
        # the store) keeps this ask and its challenge
        self._save(node.uuid)
        try:
            answer = await self._agents.call(
                "GET",
                node.base_url,
                node.tls_cert,
                "/v1/quote",
                params=request.to_query(),
            )
        except AgentUnreachableError as exc:
            raise RequestError(
                "agent_unreachable",
                f"node {node.uuid}: its agent did not give the identity quote: {exc}",
                502,
            ) from None
        except MalformedError as exc:
            raise RelayError("identity_not_over_nonce", str(exc)) from None
        self.ledger.answer_identity(node.uuid, fetch, node.ak, answer)
        LOG.info("Node %s: identity quote fetched for its tenant", node.uuid)

    def identity(self, uuid: str, scope: str | None, nonce: bytes) -> IdentityRelayed:
        node = self._node(uuid, scope)
        return IdentityRelayed(
            self.ledger.identity(node.uuid, node.project_id, scope, nonce)
        )

    async def post_u(self, uuid: str, scope: str | None, share: ShareU) -> URelayStatus:
        """Take U (sealed to NK, opaque here) for node ``uuid``: a push
        node gets it in its next answer, a polled node's agent at once.

        Raises:
            RelayError: ``wrong_project``, ``u_malformed``,
                ``u_already_posted``.
        """
        node = self._node(uuid, scope)
        self.ledger.post_u(node.uuid, node.project_id, scope, share)
        LOG.info("Node %s: U posted for relay (sealed to its NK)", node.uuid)
        if node.mode is AttestationMode.PUSH:
            self._save(node.uuid)
            return URelayStatus("waiting")
        try:
            return await self._forward_u(node)
        finally:
            self._save(node.uuid)

    async def _forward_u(self, node: LiveNode) -> URelayStatus:
        """Hand U to the polled agent; record what it said (an agent that
        did not answer counts as a refusal: the tenant may post again)."""
        share = self.ledger.deliver_u(node.uuid)
        if share is None:  # pragma: no cover - posted just now
            raise RelayError("u_not_posted", f"no U for node {node.uuid}")
        accepted, detail, bootstrapped = False, "", False
        try:
            answer = await self._agents.call(
                "POST", node.base_url, node.tls_cert, "/v1/keys/u", body=share.to_dict()
            )
            bootstrapped = ShareAccepted.from_dict(answer).bootstrapped
            accepted = True
        except (AgentUnreachableError, MalformedError) as exc:
            detail = str(exc)[:500]
        self.ledger.u_outcome(node.uuid, accepted, detail, bootstrapped)
        LOG.info(
            "Node %s: relayed U %s",
            node.uuid,
            "accepted" if accepted else f"refused ({detail})",
        )
        return self.u_status_of(node)

    def u_status_of(self, node: LiveNode) -> URelayStatus:
        held = self.ledger.u_status(node.uuid, node.project_id, None)
        if held is None:
            raise RelayError("u_not_posted", f"no U was posted for node {node.uuid}")
        return URelayStatus(held.state, held.detail, held.bootstrapped)

    def u_status(self, uuid: str, scope: str | None) -> URelayStatus:
        node = self._visible(uuid, scope)
        self._refresh(node)
        self.ledger.u_status(node.uuid, node.project_id, scope)  # its project's
        return self.u_status_of(node)

    # -- the push side -----------------------------------------------------------

    def carry(self, uuid: str, challenge_id: str) -> QuoteRequest | None:
        """The identity ask the node's new challenge carries, if any."""
        carried = self.ledger.carry(uuid, challenge_id, self._clock())
        if carried is not None:
            self._save(uuid)
        return carried

    def received(self, node: LiveNode, post: EvidencePost) -> None:
        """Take what the agent's evidence post carries for a tenant (it was
        admitted by the push gate: the node's session, its challenge).
        A bad identity quote is dropped with a warning: the tenant's ask
        stays unanswered (and the tenant's own check would refuse it)."""
        if post.identity is not None:
            try:
                self.ledger.answer_identity(
                    node.uuid, post.challenge, node.ak, post.identity
                )
                LOG.info("Node %s answered a tenant's identity ask", node.uuid)
            except RelayError as exc:
                LOG.warning("Node %s: identity quote dropped: %s", node.uuid, exc)
        outcome = post.u_outcome
        if outcome is not None:
            self.ledger.u_outcome(
                node.uuid, outcome.accepted, outcome.detail, outcome.bootstrapped
            )
            LOG.info(
                "Node %s: relayed U %s",
                node.uuid,
                "accepted" if outcome.accepted else f"refused ({outcome.detail})",
            )
        if post.identity is not None or outcome is not None:
            self._save(node.uuid)

    def deliver_u(self, uuid: str) -> ShareU | None:
        held = self.ledger.u_status(uuid, "", None)
        was = held.state if held is not None else None
        share = self.ledger.deliver_u(uuid)
        if share is not None and was != "delivered":
            self._save(uuid)
        return share

    def forget(self, uuid: str) -> None:
        """This process no longer attests ``uuid`` (the store keeps its
        state for the process that does)."""
        self.ledger.forget(uuid)
