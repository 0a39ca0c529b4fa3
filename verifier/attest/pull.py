"""Polled attestation in the verifier service: the round of a ``pull``
node. The verifier asks the node's agent for a quote over a fresh nonce on
its own mTLS connection, the pure
:class:`~verifier.protocol.attestation.NodeAttestation` judges the answer,
and the service's :class:`~verifier.attest.transitions.TransitionWriter`
acts on the verdict; V goes to the agent after its first good evidence.
The counterpart of :mod:`verifier.attest.push`, where the agent posts.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from verifier.attest.clients import AgentClient
from verifier.attest.node import LiveNode
from verifier.attest.seam import AttestingService
from verifier.exceptions import AgentUnreachableError
from verifier.protocol import MalformedError
from verifier.protocol.attestation import Action, Verdict

__all__ = ["PullAttestation"]

LOG = logging.getLogger(__name__)


class PullAttestation:
    """Quote rounds of polled nodes.

    Args:
        service: the verifier service (its rules, transitions, V and
            unreachable accounting).
        agents: the client for node agents.
        clock: wall clock (seconds).
        attesting: whether the service still attests a node (not revoked,
            deleted or handed over meanwhile).
    """

    def __init__(
        self,
        service: AttestingService,
        agents: AgentClient,
        clock: Callable[[], float],
        attesting: Callable[[LiveNode], bool],
    ) -> None:
        self._service = service
        self._agents = agents
        self._clock = clock
        self._attesting = attesting

    async def round(self, node: LiveNode) -> bool:
        """One quote round of ``node``; True if another is needed at once.
        Errors other than the transport's and a malformed answer propagate
        to the service, which fails the node closed."""
        service = self._service
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
                service.unreachable(node, str(exc))
            return False
        except MalformedError as exc:  # it answered, but not with a JSON object
            answer = exc
        if not self._attesting(node):  # revoked or deleted meanwhile
            return False
        verdict = node.judge(request, answer, self._clock(), service.rules)
        if not verdict and verdict.transition is not None:
            failed = verdict.transition.failure_reason
            LOG.warning("Node %s failed attestation: %s", node.uuid, failed)
        service.transitions.act(node, verdict)
        if verdict.action is Action.ASK_AGAIN:
            return True
        if verdict.action is Action.RELEASE_V:
            await self._release_v(node, verdict)
        abe = service.abe
        if (
            abe is not None
            and verdict.attest is not None
            and verdict.nk is not None
            and self._attesting(node)
        ):
            await abe.after_quote(node, verdict.attest, verdict.nk)
        return False

    async def _release_v(self, node: LiveNode, verdict: Verdict) -> None:
        service = self._service
        body = service.share_v(node, verdict)
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
            service.transitions.act(node, node.revoke("malformed", str(exc)))
            return
        if not self._attesting(node):  # revoked while V was in flight
            return
        service.transitions.act(
            node, node.v_delivered(), identity_cert=body.identity_cert
        )
        LOG.info("Node %s attested; V released", node.uuid)
