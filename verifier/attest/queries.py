"""The verifier's read side: a node's view, the list, the counters.

Nodes this process attests answer from memory (their hot state is newer
than the database's); the others from the shared database.
"""

from __future__ import annotations

from typing import Any

from verifier.attest.node import LiveNode, NodeState, NodeView, view_of_row
from verifier.attest.ownership import Ownership
from verifier.attest.store import NodeStore
from verifier.exceptions import NotFoundError
from verifier.protocol import canonical_uuid

__all__ = ["NodeQueries"]


class NodeQueries:
    """Mixed into :class:`~verifier.attest.service.Verifier`."""

    store: NodeStore
    _nodes: dict[str, LiveNode]
    _ownership: Ownership

    def get(self, uuid: str) -> NodeView:
        """Raises: NotFoundError."""
        uuid = canonical_uuid(uuid)
        node = self._nodes.get(uuid)
        if node is not None:
            return node.view()
        row = self.store.load(uuid)
        if row is None:
            raise NotFoundError("unknown_node", f"node {uuid} is not enrolled")
        return view_of_row(row)

    def stats(self) -> dict[str, Any]:
        """Counts for operators and benchmarks: nodes per state (this
        process's view of its own nodes, the database's of the others) and
        quotes verified."""
        states: dict[str, int] = {s.value: 0 for s in NodeState}
        db = self.store.states()
        for uuid, state in db.items():
            node = self._nodes.get(uuid)
            states[node.state.value if node else state] += 1
        local = sum(n.quotes_verified for n in self._nodes.values())
        return {
            "nodes": len(db),
            "states": states,
            "owned": len(self._nodes),
            "member": self._ownership.member_id,
            "quotes_verified": local,
        }

    def list(self) -> list[NodeView]:
        views = []
        for row in self.store.load_all():
            node = self._nodes.get(row.uuid)
            views.append(node.view() if node else view_of_row(row))
        return views
