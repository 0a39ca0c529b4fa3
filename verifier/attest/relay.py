"""The tenant's relay to push nodes in the verifier service
(:mod:`verifier.protocol.relay`): a tenant's identity ask rides on the
node's next push challenge, the agent's identity quote comes back with its
evidence, and U (sealed to NK) rides on the next answer. The state is the
:class:`~verifier.protocol.relay.RelayLedger` of the process that attests
the node (push nodes are attested by one verifier process at a time).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from verifier.attest.node import LiveNode
from verifier.exceptions import ConflictError
from verifier.protocol.messages.push import EvidencePost
from verifier.protocol.messages.quote import QuoteRequest
from verifier.protocol.messages.relay import IdentityRelayed, URelayStatus
from verifier.protocol.messages.shares import ShareU
from verifier.protocol.relay import RelayError, RelayLedger

if TYPE_CHECKING:
    from verifier.attest.seam import AttestingService

__all__ = ["TenantRelay"]

LOG = logging.getLogger(__name__)


class TenantRelay:
    """Relays identity quotes and U between tenants and push agents.

    Args:
        verifier: the service (its live nodes).
        clock: wall clock (seconds).
    """

    def __init__(self, verifier: AttestingService, clock: Callable[[], float]) -> None:
        self._verifier = verifier
        self._clock = clock
        self.ledger = RelayLedger()

    def _node(self, uuid: str) -> LiveNode:
        """The live push node ``uuid``.

        Raises:
            NotFoundError: not enrolled here.
            ConflictError: ``not_push_mode`` (the tenant reaches a polled
                node's agent directly).
        """
        node = self._verifier.live(uuid)
        if node.mode != "push":
            raise ConflictError(
                "not_push_mode",
                f"node {node.uuid} is polled: talk to its agent directly",
            )
        return node

    # -- the tenant's side -----------------------------------------------------

    def ask_identity(self, uuid: str, scope: str | None, request: QuoteRequest) -> None:
        node = self._node(uuid)
        self.ledger.ask_identity(
            node.uuid, node.project_id, scope, request, self._clock()
        )

    def identity(self, uuid: str, scope: str | None, nonce: bytes) -> IdentityRelayed:
        node = self._node(uuid)
        return IdentityRelayed(
            self.ledger.identity(node.uuid, node.project_id, scope, nonce)
        )

    def post_u(self, uuid: str, scope: str | None, share: ShareU) -> URelayStatus:
        node = self._node(uuid)
        self.ledger.post_u(node.uuid, node.project_id, scope, share)
        LOG.info("Node %s: U posted for relay (sealed to its NK)", node.uuid)
        return URelayStatus("waiting")

    def u_status(self, uuid: str, scope: str | None) -> URelayStatus:
        node = self._node(uuid)
        held = self.ledger.u_status(node.uuid, node.project_id, scope)
        if held is None:
            raise RelayError("u_not_posted", f"no U was posted for node {node.uuid}")
        return URelayStatus(held.state, held.detail, held.bootstrapped)

    # -- the push side -----------------------------------------------------------

    def carry(self, uuid: str, challenge_id: str) -> QuoteRequest | None:
        """The identity ask the node's new challenge carries, if any."""
        return self.ledger.carry(uuid, challenge_id, self._clock())

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

    def deliver_u(self, uuid: str) -> ShareU | None:
        return self.ledger.deliver_u(uuid)

    def forget(self, uuid: str) -> None:
        self.ledger.forget(uuid)
