"""Polled attestation in the verifier service: the round of a ``pull``
node. The verifier asks the node's agent for a quote over a fresh nonce on
its own mTLS connection, the pure
:class:`~verifier.protocol.attestation.NodeAttestation` judges the answer,
the :class:`~verifier.attest.transitions.TransitionWriter` acts on the
verdict, and V (:mod:`verifier.attest.release`) goes to the agent after
its first good evidence. The counterpart of :mod:`verifier.attest.push`,
where the agent posts. Called by :mod:`verifier.attest.rounds`; calls only
down.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from verifier.attest.clients import VerifierAgentClient
from verifier.attest.host_batches import HostBatches
from verifier.attest.node import LiveNode
from verifier.attest.registry import LiveNodes
from verifier.attest.release import ShareRelease
from verifier.attest.transitions import TransitionWriter
from verifier.common import metrics
from verifier.exceptions import AgentUnreachableError
from verifier.protocol import MalformedError
from verifier.protocol.attestation import Action, Verdict

if TYPE_CHECKING:  # CP-ABE is the abe extra
    from verifier.attest.abe_keys import AbeAuthority

__all__ = ["PullAttestation"]

LOG = logging.getLogger(__name__)


class PullAttestation:
    """Quote rounds of polled nodes.

    Args:
        agents: the client for node agents.
        nodes: the live nodes (whether one is still attested here: not
            revoked, deleted or handed over meanwhile).
        transitions: acts on verdicts (the rules, the unreachable count).
        release: makes V for a node that passed.
        abe: issues CP-ABE keys after good quotes (None: off).
        clock: wall clock (seconds).
        batches: the batched deep quotes: a guest's good quote joins its
            host's batch, a host's quote binds it (None: off).
    """

    def __init__(
        self,
        agents: VerifierAgentClient,
        nodes: LiveNodes,
        transitions: TransitionWriter,
        release: ShareRelease,
        abe: AbeAuthority | None,
        clock: Callable[[], float],
        batches: HostBatches | None = None,
    ) -> None:
        self._agents = agents
        self._batches = batches
        self._attesting = nodes.attesting
        self._transitions = transitions
        self._release = release
        self._abe = abe
        self._clock = clock

    async def round(self, node: LiveNode) -> bool:
        """One quote round of ``node``; True if another is needed at once.
        Errors other than the transport's and a malformed answer propagate
        to the round dispatch, which fails the node closed."""
        transitions = self._transitions
        started = time.perf_counter()
        batches = self._batches
        host_round = None
        if node.is_host and batches is not None:  # its quote binds the batch
            host_round = batches.begin(node.uuid)
            request = node.request(host_round.nonce)
        else:
            request = node.request(os.urandom(20))
        answer: object
        try:
            answer = await self._agents.call(
                "GET",
                node.base_url,
                node.tls_cert,
                "/v1/quote",
                params=request.to_query(),
            )
        except AgentUnreachableError as exc:
            if self._attesting(node):
                transitions.missed(node, str(exc))
            return False
        except MalformedError as exc:  # it answered, but not with a JSON object
            answer = exc
        if not self._attesting(node):  # revoked or deleted meanwhile
            return False
        verdict = node.judge(request, answer, self._clock(), transitions.rules)
        metrics.judged("pull", verdict, started)
        if not verdict and verdict.transition is not None:
            failed = verdict.transition.failure_reason
            LOG.warning("Node %s failed attestation: %s", node.uuid, failed)
        transitions.act(node, verdict)
        if host_round is not None:
            assert batches is not None
            batches.finished(host_round, verdict, answer)
        elif batches is not None and verdict and verdict.attest is not None:
            batches.guest_passed(node.uuid, verdict.attest)
        if verdict.action is Action.ASK_AGAIN:
            return True
        if verdict.action is Action.RELEASE_V:
            await self._release_v(node, verdict)
        abe = self._abe
        if (
            abe is not None
            and verdict.attest is not None
            and verdict.nk is not None
            and self._attesting(node)
        ):
            await abe.after_quote(node, verdict.attest, verdict.nk)
        return False

    async def _release_v(self, node: LiveNode, verdict: Verdict) -> None:
        body = self._release.share_v(node, verdict)
        if body is None:
            return
        try:
            await self._agents.call(
                "POST", node.base_url, node.tls_cert, "/v1/keys/v", body=body.to_dict()
            )
        except AgentUnreachableError as exc:
            LOG.warning("Could not deliver V to node %s yet: %s", node.uuid, exc)
            return
        except MalformedError as exc:  # it took V but answered with no object
            self._transitions.act(node, node.revoke("malformed", str(exc)))
            return
        if not self._attesting(node):  # revoked while V was in flight
            return
        self._transitions.act(
            node, node.v_delivered(), identity_cert=body.identity_cert
        )
        LOG.info("Node %s attested; V released", node.uuid)
