"""The nodes one verifier process attests, and what it writes behind.

:class:`LiveNodes` is the live map every part of the service looks nodes
up in (the quote rounds, push, the tenant relay, the API); it only maps.
Which nodes enter and leave it is :mod:`verifier.attest.membership`'s
business. :class:`WriteBehind` writes the map's hot state (TPM clock,
last attestation, counters) to the database every few seconds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import sqlalchemy as sa

from verifier.attest.node import LiveNode, NodeState
from verifier.attest.pending import is_waiting
from verifier.attest.store import NodeStore
from verifier.common.errors import unknown_node
from verifier.protocol import canonical_uuid
from verifier.protocol.attestation import AttestationMode

__all__ = ["LiveNodes", "WriteBehind"]

LOG = logging.getLogger(__name__)
_FLUSH_INTERVAL = 5.0


class LiveNodes:
    """The nodes this process attests, by canonical UUID.

    Args:
        store: the shared node table (for nodes another process attests).
    """

    def __init__(self, store: NodeStore) -> None:
        self._store = store
        self._nodes: dict[str, LiveNode] = {}

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, uuid: object) -> bool:
        return uuid in self._nodes

    def __iter__(self) -> Iterator[LiveNode]:
        return iter(list(self._nodes.values()))

    def find(self, uuid: str) -> LiveNode | None:
        """The live node of canonical ``uuid``, or None."""
        return self._nodes.get(uuid)

    def live(self, uuid: str) -> LiveNode:
        """The live node ``uuid`` (any form of the UUID).

        Raises:
            NotFoundError: not attested by this process.
        """
        uuid = canonical_uuid(uuid)
        node = self._nodes.get(uuid)
        if node is None:
            raise unknown_node(uuid)
        return node

    def attesting(self, node: LiveNode) -> bool:
        """Whether ``node`` is still attested here: not revoked, deleted or
        handed over since its round started."""
        return node.state != NodeState.REVOKED and self._nodes.get(node.uuid) is node

    def add(self, node: LiveNode) -> None:
        self._nodes[node.uuid] = node

    def remove(self, node: LiveNode) -> None:
        self._nodes.pop(node.uuid, None)

    def relay_node(self, uuid: str) -> LiveNode:
        """The node as the tenant relay needs it: the one this process
        attests, or a polled node another process attests, read from the
        database (the relay to it is stateless here: its agent is asked
        at once).

        Raises:
            NotFoundError: not enrolled, not in the quote loop yet, or a
                push node another process attests.
        """
        uuid = canonical_uuid(uuid)
        node = self._nodes.get(uuid)
        if node is not None:
            return node
        row = self._store.load(uuid)
        if (
            row is None
            or is_waiting(row.state)
            or row.attestation_mode == AttestationMode.PUSH
        ):
            raise unknown_node(uuid)
        return LiveNode.from_row(row)


class WriteBehind:
    """Writes the live nodes' hot state behind.

    Args:
        store: the node table.
        nodes: the live nodes.
    """

    def __init__(self, store: NodeStore, nodes: LiveNodes) -> None:
        self._store = store
        self._nodes = nodes

    def flush(self) -> None:
        """Write every dirty node now, on this thread (at shutdown)."""
        self._store.flush(list(self._nodes))

    async def write(self) -> None:
        """The hot state of the dirty nodes, taken on the loop (where they
        change), written on a worker thread: thousands of rows every few
        seconds must not stop the quote loop or the API."""
        rows = self._store.hot_rows(self._nodes)
        await asyncio.to_thread(self._store.write_hot, rows)

    async def run(self) -> None:
        """Write behind every few seconds, whatever the database does."""
        while True:
            await asyncio.sleep(_FLUSH_INTERVAL)
            try:
                await self.write()
            except sa.exc.SQLAlchemyError:
                LOG.exception("Write-behind of attestation state failed")
