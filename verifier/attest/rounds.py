"""One attestation round of a node, failing closed, for both modes.

The quote scheduler (:mod:`verifier.attest.scheduler`) runs a round of
each live node whenever it is due: a polled node is asked for a quote
(:mod:`verifier.attest.pull`), a push node's deadline is checked (its
agent posts evidence on its own, :mod:`verifier.attest.push`). Whatever
goes wrong in a round is a verdict on the node, never "no change".
"""

from __future__ import annotations

import asyncio
import logging

import sqlalchemy as sa

from verifier.attest.host_verdicts import HostVerdicts
from verifier.attest.node import LiveNode, NodeView
from verifier.attest.pull import PullAttestation
from verifier.attest.push import PushAttestation
from verifier.attest.registry import LiveNodes
from verifier.attest.transitions import TransitionWriter
from verifier.protocol.attestation import AttestationMode

__all__ = ["RoundDispatch"]

LOG = logging.getLogger(__name__)


class RoundDispatch:
    """Runs nodes' rounds.

    Args:
        nodes: the live nodes.
        pull: the rounds of polled nodes.
        push: the deadlines of push nodes.
        transitions: fails a node whose round broke.
        hosts: told of a compute host's state after each of its rounds
            (its verdict, its guests, its trait and trust).
    """

    def __init__(
        self,
        nodes: LiveNodes,
        pull: PullAttestation,
        push: PushAttestation,
        transitions: TransitionWriter,
        hosts: HostVerdicts | None = None,
    ) -> None:
        self._nodes = nodes
        self._pull = pull
        self._push = push
        self._transitions = transitions
        self._hosts = hosts

    async def attest_once(self, uuid: str) -> NodeView:
        """Ask the node for one quote (more when its runtime evidence needs
        another round) and act on the verdict.

        Raises:
            NotFoundError: not attested by this process.
        """
        node = self._nodes.live(uuid)
        await self.attest(node)
        return node.view()

    async def attest(self, node: LiveNode) -> None:
        """The scheduler's round of ``node`` (no look-up, no view: the
        quote loop runs this thousands of times a second)."""
        while await self._round(node):  # the node bounds its rounds
            pass
        if node.is_host and self._hosts is not None:  # what it means for the pool
            self._hosts.judged(node.uuid, node.state, node.failure_reason)

    async def _round(self, node: LiveNode) -> bool:
        """One quote round; True if another is needed at once.

        Fails closed: whatever goes wrong while the evidence is obtained or
        judged, V released or keys issued is a verdict on the node -- an
        answer that does not parse revokes it (``malformed``), a transport
        failure counts towards ``unreachable``, and any other error fails it
        at once (``internal_error``, :meth:`NodeAttestation.round_failed`).
        Only a database error (the verdict cannot be written; the next round
        judges again) and cancellation propagate.
        """
        if not self._nodes.attesting(node):
            return False
        try:
            if node.mode is AttestationMode.PUSH:  # its agent posts
                self._push.deadline_round(node)
                return False
            return await self._pull.round(node)
        except (asyncio.CancelledError, sa.exc.SQLAlchemyError):
            raise
        except Exception as exc:  # fail closed: see the docstring
            LOG.exception("Node %s: its quote round broke", node.uuid)
            if self._nodes.attesting(node):
                detail = f"{type(exc).__name__}: {exc}"
                self._transitions.act(node, node.round_failed("internal_error", detail))
            return False
