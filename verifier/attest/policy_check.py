"""The dry run of a candidate runtime policy in the verifier service
(``POST /v1/policies/runtime/{ref}/check``, or of a document not stored:
``POST /v1/policies/runtime/check``): each node's whole current IMA
list, fetched live with a fresh quote, judged against the candidate by the
pure :class:`~verifier.protocol.attestation.PolicyDryRun`.

It changes nothing: it reads the node's identity (its AK, its agent's
address and pinned certificate) and asks its agent for a quote on the
verifier's own mTLS connection, exactly as a polled round does, but
never touches the node's attestation state -- no transition, no event, no
IMA replay position, nothing written behind.

* Only the caller's project: its policies and its nodes (another
  project's node is unknown, as a missing one).
* A push node's agent opens no port, and the verifier keeps only the
  replay position of its list, not the list: it cannot be fetched, and
  is an ``error`` with the reason ``push_mode_not_fetchable``.
* At most :data:`CONCURRENCY` nodes at a time, each within
  :data:`NODE_TIMEOUT` seconds (its agent's own answers within the agent
  timeout).

Called by the policy API (:mod:`verifier.api.policies_app`); calls only
down.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Sequence

from verifier.attest.clients import VerifierAgentClient
from verifier.attest.node import NodeState
from verifier.attest.pending import is_waiting
from verifier.attest.policies import RUNTIME, PolicyStore
from verifier.attest.registry import LiveNodes
from verifier.attest.store import NodeStore
from verifier.db import Node
from verifier.exceptions import AgentUnreachableError, NotFoundError
from verifier.protocol import AttestationKey, MalformedError, TpmPublic
from verifier.protocol.attestation import AttestationMode, PolicyDryRun
from verifier.protocol.ima import RuntimePolicy
from verifier.protocol.messages.policy_check import (
    NodeCheck,
    PolicyCheckReport,
    PolicyCheckRequest,
    PolicyRef,
)

__all__ = ["CONCURRENCY", "NODE_TIMEOUT", "PolicyChecker"]

LOG = logging.getLogger(__name__)
#: Nodes checked at once.
CONCURRENCY = 16
#: Seconds one node's check may take (all its quotes).
NODE_TIMEOUT = 60.0
_NONCE_BYTES = 20


class PolicyChecker:
    """Dry runs of runtime policies.

    Args:
        store: the node table (the nodes' identities).
        nodes: the live nodes (a revoked node's state may be newer here).
        policies: the policy store (the candidate).
        agents: the verifier's client for polled agents.
        concurrency: nodes checked at once.
        node_timeout: seconds one node's check may take.
        random: makes nonces.
    """

    def __init__(
        self,
        store: NodeStore,
        nodes: LiveNodes,
        policies: PolicyStore,
        agents: VerifierAgentClient,
        concurrency: int = CONCURRENCY,
        node_timeout: float = NODE_TIMEOUT,
        random: Callable[[int], bytes] = os.urandom,
    ) -> None:
        self._store = store
        self._nodes = nodes
        self._policies = policies
        self._agents = agents
        self._concurrency = concurrency
        self._timeout = node_timeout
        self._random = random

    async def check(
        self, ref: str, project: str, request: PolicyCheckRequest
    ) -> PolicyCheckReport:
        """Judge ``request``'s nodes of ``project`` against the runtime
        policy ``ref`` of ``project``.

        Raises:
            NotFoundError: ``unknown_policy`` naming ``ref``;
                ``unknown_node`` naming the first listed node that is not
                ``project``'s (or not enrolled).
        """
        digest = await asyncio.to_thread(self._policies.resolve, RUNTIME, ref, project)
        policy = await asyncio.to_thread(self._policies.load, digest)
        assert isinstance(policy, RuntimePolicy)
        return await self._judge(policy, project, request)

    async def check_candidate(
        self, document: object, project: str, request: PolicyCheckRequest
    ) -> PolicyCheckReport:
        """Judge ``request``'s nodes of ``project`` against the runtime
        policy ``document`` that is not stored (a delta composed with its
        base among ``project``'s policies, as
        :meth:`~verifier.attest.policies.PolicyStore.add` would); nothing
        is stored.

        Raises:
            RequestError: ``bad_policy`` naming the problem.
            NotFoundError: ``unknown_policy`` naming a delta's missing
                base; ``unknown_node`` as :meth:`check`.
        """
        policy = await asyncio.to_thread(self._policies.candidate, document, project)
        return await self._judge(policy, project, request)

    async def _judge(
        self, policy: RuntimePolicy, project: str, request: PolicyCheckRequest
    ) -> PolicyCheckReport:
        rows = await asyncio.to_thread(self._rows, request, project)
        gate = asyncio.Semaphore(self._concurrency)

        async def one(row: Node) -> NodeCheck:
            async with gate:
                return await self._check_node(row, policy)

        results = await asyncio.gather(*(one(row) for row in rows))
        ref_of = PolicyRef(policy.name, policy.version, policy.digest.hex())
        return PolicyCheckReport(ref_of, tuple(results))

    def _rows(self, request: PolicyCheckRequest, project: str) -> Sequence[Node]:
        """The nodes to check, in the order asked (``all``: the project's
        nodes but the revoked ones, which no policy change affects).

        Raises:
            NotFoundError: a listed node is not ``project``'s.
        """
        if request.all:
            rows = self._store.load_all(project)
            return [r for r in rows if r.state != NodeState.REVOKED.value]
        found = {r.uuid: r for r in self._store.load_many(list(request.nodes))}
        for uuid in request.nodes:
            row = found.get(uuid)
            if row is None or (row.project_id or "") != project:
                raise NotFoundError("unknown_node", f"node {uuid} is not enrolled")
        return [found[uuid] for uuid in request.nodes]

    async def _check_node(self, row: Node, policy: RuntimePolicy) -> NodeCheck:
        """One node's outcome; never raises (whatever breaks is an
        ``error`` naming it)."""
        uuid = row.uuid
        try:
            ak = self._key(row)
            if isinstance(ak, NodeCheck):
                return ak
            run = PolicyDryRun(uuid, ak, policy)
            base, cert = f"https://{row.host}:{row.port}", row.tls_cert
            async with asyncio.timeout(self._timeout):
                while True:
                    outcome = await self._round(run, base, cert)
                    if outcome is not None:
                        return outcome
        except TimeoutError:
            return NodeCheck.error_of(
                uuid, "timeout", f"no complete answer within {self._timeout:g} s"
            )
        except Exception as exc:  # fail closed: a check that breaks is no pass
            LOG.exception("Policy check of node %s broke", uuid)
            return NodeCheck.error_of(uuid, "check_error", type(exc).__name__)

    def _key(self, row: Node) -> AttestationKey | NodeCheck:
        """The node's AK, or the ``error`` of a node that cannot be
        checked."""
        live = self._nodes.find(row.uuid)
        state = live.state.value if live is not None else row.state
        if state == NodeState.REVOKED.value:
            return NodeCheck.error_of(row.uuid, "node_revoked", "the node is revoked")
        if row.attestation_mode == AttestationMode.PUSH.value:
            return NodeCheck.error_of(
                row.uuid,
                "push_mode_not_fetchable",
                "a push node's agent opens no port and the verifier keeps no "
                "copy of its list",
            )
        if is_waiting(state) or not row.ak_public:
            return NodeCheck.error_of(
                row.uuid, "node_not_registered", "its agent has not registered yet"
            )
        try:
            public = TpmPublic.from_bytes(row.ak_public)
        except MalformedError as exc:
            return NodeCheck.error_of(row.uuid, "malformed", str(exc))
        return AttestationKey(public, activated=True)

    async def _round(self, run: PolicyDryRun, base: str, cert: str) -> NodeCheck | None:
        request = run.request(self._random(_NONCE_BYTES))
        answer: object
        try:
            answer = await self._agents.call(
                "GET", base, cert, "/v1/quote", params=request.to_query()
            )
        except AgentUnreachableError as exc:
            return run.error("agent_unreachable", str(exc))
        except MalformedError as exc:  # it answered, but not with a JSON object
            answer = exc
        return run.judge(request, answer)
