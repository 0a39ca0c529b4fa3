"""The verifier's read side: a node's view, the list, the counters.

Nodes this process attests answer from memory (their hot state is newer
than the database's); the others from the shared database.

Every read of the database runs on a worker thread (``asyncio.to_thread``,
as the service's other database work does): these are the API's reads,
and a query of the whole node table (the list, the counters) at 100,000
nodes, or one waiting on a database lock, must not stop the event loop
that quotes the fleet and answers every other request. The live nodes are
read on the loop only, where they change.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import Any

from verifier.attest.host_store import HostStore
from verifier.attest.node import (
    VIEW_COLUMNS,
    NodeState,
    NodeView,
    iso8601,
    view_of_row,
)
from verifier.attest.ownership import Ownership
from verifier.attest.policies import PolicyStore
from verifier.attest.registry import LiveNodes
from verifier.attest.scheduler import QuoteScheduler
from verifier.attest.store import NodeStore
from verifier.exceptions import NotFoundError
from verifier.protocol import canonical_uuid

__all__ = ["NodeQueries", "visible"]


def visible(owner: str, scope: str | None) -> bool:
    """Whether a resource of project ``owner`` is in ``scope`` (a project,
    or None for every project)."""
    return scope is None or owner == scope


class NodeQueries:
    """The nodes as the API reads them.

    Args:
        store: the shared node table.
        nodes: the nodes this process attests.
        ownership: which nodes this process attests (its member id).
        scheduler: the quote loop (its verification classes).
        policies: the stored policies (the names of those in force).
        hosts: the compute hosts (the verdict of a node's host; None: none
            shown).
    """

    def __init__(
        self,
        store: NodeStore,
        nodes: LiveNodes,
        ownership: Ownership,
        scheduler: QuoteScheduler,
        policies: PolicyStore | None = None,
        hosts: HostStore | None = None,
    ) -> None:
        self.store = store
        self._hosts = hosts
        self._policies = policies
        self._nodes = nodes
        self._ownership = ownership
        self._scheduler = scheduler

    async def get(self, uuid: str, scope: str | None = None) -> NodeView:
        """A node of project ``scope`` (None: of any project).

        Raises:
            NotFoundError: not enrolled, or owned by another project (the
                same answer, so that a project learns nothing of others').
        """
        uuid = canonical_uuid(uuid)
        node = self._nodes.find(uuid)
        view = None
        if node is None:
            row = await asyncio.to_thread(self.store.load, uuid)
            node = self._nodes.find(uuid)  # adopted meanwhile: memory is newer
            if node is None and row is not None and row.kind != "host":
                view = view_of_row(row)
        if node is not None and not node.is_host:  # hosts: /v1/hosts
            view = node.view()
        if view is None or not visible(view.project_id, scope):
            raise NotFoundError("unknown_node", f"node {uuid} is not enrolled")
        return (await self.named([view]))[0]

    async def named(self, views: Sequence[NodeView]) -> list[NodeView]:
        """``views`` with the name and version of the policies in force,
        and their compute host's verdict."""
        views = await self._hosted(views)
        if self._policies is None:
            return list(views)
        pairs = {
            (view.project_id, digest)
            for view in views
            for digest in (view.runtime_policy, view.mb_policy)
            if digest is not None
        }
        if not pairs:
            return list(views)
        names = await asyncio.to_thread(self._policies.names, pairs)
        by_project: dict[str, dict[str, tuple[str, int]]] = {}
        for (project, digest), name in names.items():
            by_project.setdefault(project, {})[digest] = name
        return [
            dataclasses.replace(view, names=by_project.get(view.project_id, {}))
            for view in views
        ]

    async def _hosted(self, views: Sequence[NodeView]) -> Sequence[NodeView]:
        """``views`` with their compute host's verdict (as last written)."""
        if self._hosts is None or not views:
            return views
        placed = await asyncio.to_thread(
            self._hosts.hosts_of, [view.uuid for view in views]
        )
        if not placed:
            return views
        hosts = await asyncio.to_thread(self._hosts.by_name)
        out = []
        for view in views:
            name = placed.get(view.uuid)
            if name is not None:
                row = hosts.get(name)
                host = {
                    "name": name,
                    "trusted": None if row is None else row.trusted,
                    "as_of": None if row is None else iso8601(row.verdict_at),
                }
                view = dataclasses.replace(view, host=host)
            out.append(view)
        return out

    async def stats(self) -> dict[str, Any]:
        """Counts for operators and benchmarks: nodes per state (this
        process's view of its own nodes, the database's of the others) and
        quotes verified; per verification class (quote interval) the
        rounds this process started and how late (``stretch``: the period
        its nodes see over their interval, 1.0 when nothing is late)."""
        states: dict[str, int] = {s.value: 0 for s in NodeState}
        db = await asyncio.to_thread(self.store.states, True)  # hosts: gauges
        for uuid, state in db.items():
            node = self._nodes.find(uuid)
            states[node.state.value if node else state] += 1
        local = sum(n.quotes_verified for n in self._nodes if not n.is_host)
        return {
            "nodes": len(db),
            "states": states,
            "owned": len(self._nodes),
            "member": self._ownership.member_id,
            "quotes_verified": local,
            "classes": self._scheduler.classes(),
        }

    async def list(self, scope: str | None = None) -> list[NodeView]:
        """The nodes of project ``scope`` (None: of every project)."""
        views = []
        # only the columns of a view: not each node's certificate, AK and
        # V share (a list of 10,000 nodes read ~10 MB more, every call)
        rows = await asyncio.to_thread(self.store.load_all, scope, VIEW_COLUMNS)
        for row in rows:
            node = self._nodes.find(row.uuid)
            views.append(node.view() if node else view_of_row(row))
        return await self.named(views)
