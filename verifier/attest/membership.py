"""Which nodes this verifier process attests.

A node enters the live map (:class:`~verifier.attest.registry.LiveNodes`)
when it is enrolled or promoted by a process that owns it, or when the
ownership (:mod:`verifier.attest.ownership`) hands it to this process;
it leaves when deleted, revoked by another process, or handed over.
:class:`Membership` is that entering and leaving; :class:`OwnershipSync`
reconciles the map with the shared database and the ownership group.
"""

from __future__ import annotations

import asyncio
import logging

from verifier.attest.clients import VerifierAgentClient
from verifier.attest.node import LiveNode, NodeState
from verifier.attest.ownership import Ownership
from verifier.attest.pending import PendingNodes, is_waiting
from verifier.attest.policies import PolicyStore
from verifier.attest.push import PushAttestation
from verifier.attest.registry import LiveNodes
from verifier.attest.scheduler import QuoteScheduler
from verifier.attest.store import NodeStore

__all__ = ["Membership", "OwnershipSync"]

LOG = logging.getLogger(__name__)


def _in_force(
    node: LiveNode,
) -> tuple[tuple[str | None, str | None], tuple[str | None, str | None]]:
    return (node.runtime_ref, node.mb_ref), node.follows


class Membership:
    """Puts nodes into the quote loop and takes them out.

    Args:
        nodes: the live map.
        scheduler: the quote loop.
        push: the push side (its per-node state).
        agents: the client for polled agents (their kept connections).
    """

    def __init__(
        self,
        nodes: LiveNodes,
        scheduler: QuoteScheduler,
        push: PushAttestation,
        agents: VerifierAgentClient,
    ) -> None:
        self._nodes = nodes
        self._scheduler = scheduler
        self._push = push
        self._agents = agents

    def adopt(self, node: LiveNode, fresh: bool = False) -> None:
        """Attest ``node`` here from now on (a revoked one is only held);
        ``fresh``: enrolled by this process just now."""
        self._nodes.add(node)
        self._push.adopted(node.uuid, fresh)
        if node.state != NodeState.REVOKED:
            self._scheduler.schedule(node, 0.0)

    def release(self, node: LiveNode) -> None:
        """Stop attesting ``node`` here (its pending heap entry is skipped
        when it comes due)."""
        self._nodes.remove(node)
        self._agents.forget(node.base_url, node.tls_cert)  # its connection
        self._push.forget(node.uuid)


class OwnershipSync:
    """Reconciles the live map with the database and the ownership.

    Args:
        nodes: the live map.
        membership: adopts and releases nodes.
        store: the shared node table.
        ownership: which nodes this process attests.
        pending: nodes waiting for their instance (it tracks the created
            ones this process owns).
        policies: the stored policies adopted nodes use.
        interval: seconds between syncs.
    """

    def __init__(
        self,
        nodes: LiveNodes,
        membership: Membership,
        store: NodeStore,
        ownership: Ownership,
        pending: PendingNodes,
        policies: PolicyStore,
        interval: float,
    ) -> None:
        self._nodes = nodes
        self._membership = membership
        self._store = store
        self._ownership = ownership
        self._pending = pending
        self._policies = policies
        self._interval = interval

    async def sync(self) -> None:
        """Reconcile with the database and the ownership: adopt nodes that
        became ours, let go of nodes that did not stay ours, and stop nodes
        that another verifier revoked or deleted."""
        await self._ownership.refresh()
        states = await asyncio.to_thread(self._store.states)
        self._pending.sync(states)
        await self._let_go(states)
        owns = self._ownership.owns
        wanted = [
            uuid
            for uuid, state in states.items()
            if uuid not in self._nodes
            and state != NodeState.REVOKED
            and not is_waiting(state)
            and owns(uuid)
        ]
        rows = await asyncio.to_thread(self._store.load_many, wanted)
        await asyncio.to_thread(self._policies.preload, rows)
        for row in rows:
            if row.state != NodeState.REVOKED and row.uuid not in self._nodes:
                self._membership.adopt(LiveNode.from_row(row, self._policies.cached))
        if wanted:
            LOG.info(
                "Attesting %d more node(s); %d in all", len(wanted), len(self._nodes)
            )
        await self._follow_policies()

    async def _follow_policies(self) -> None:
        """Take the policies in force that another verifier process changed
        (a tenant set them, or a new version they follow was added there):
        the live nodes judge with them from their next quote on."""
        if not len(self._nodes):
            return
        # a change made here meanwhile is newer than what is read: it is
        # committed before the live node takes it, so a node whose policies
        # are still those seen before the read takes the stored ones
        before = {node.uuid: _in_force(node) for node in self._nodes}
        stored = await asyncio.to_thread(self._store.policy_refs)
        changed = []
        for node in self._nodes:
            found = stored.get(node.uuid)
            now = _in_force(node)
            if (
                found is None
                or node.state == NodeState.REVOKED
                or before.get(node.uuid) != now
                or found == now
            ):
                continue
            changed.append((node, *found))
        if not changed:
            return
        digests = [d for _, refs, _ in changed for d in refs if d is not None]
        await asyncio.to_thread(self._policies.load_many, digests)
        for node, refs, follows in changed:
            node.use(refs, follows, self._policies.cached)
        LOG.info("%d node(s) judge with policies changed elsewhere", len(changed))

    async def _let_go(self, states: dict[str, str]) -> None:
        """Release the live nodes that were deleted, revoked by another
        process, or handed to another (their hot state written first)."""
        for node in self._nodes:
            db_state = states.get(node.uuid)
            if db_state is None:
                self._membership.release(node)
            elif db_state == NodeState.REVOKED and node.state != NodeState.REVOKED:
                node.revoked_elsewhere()
                self._membership.release(node)
            elif not self._ownership.owns(node.uuid):
                hot = self._store.hot_rows([node])
                await asyncio.to_thread(self._store.write_hot, hot)
                self._membership.release(node)
                LOG.info("Node %s handed to another verifier", node.uuid)

    async def run(self) -> None:
        """Sync every interval, whatever the database or coordinator do."""
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.sync()
            except Exception:  # the database or coordinator may be away
                LOG.exception("Sync with the database and the group failed")
