"""The attestation log's reads behind the API: the latest checkpoint, a
node's history with an inclusion proof of every entry in that
checkpoint's tree, and consistency proofs between two sizes.

A history is read at one tree size (the head's, read in the same
transaction as the entries), so each proof is against the checkpoint
served with it. Its proofs are computed from the stored perfect subtrees
(:class:`~verifier.db.LogNode`): first with a recording getter that only
notes which (level, index) pairs the proofs need, then with those hashes
fetched in a few queries.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from verifier.db import LogEntryRow, LogHead, LogNode
from verifier.exceptions import NotFoundError, RequestError
from verifier.protocol import translog
from verifier.tlog.sequencer import HEAD_ID

__all__ = ["History", "LogReader"]

#: The most entries one history answer holds.
MAX_ENTRIES = 10_000
_ZERO = bytes(32)


@dataclasses.dataclass(frozen=True)
class History:
    """A node's entries at one tree size, each with its inclusion proof.

    Attributes:
        node_uuid: the node.
        checkpoint: the signed note of the tree the proofs are against.
        tree_size: that tree's size.
        last: the leaf index of the node's last entry at that size.
        complete_from: every entry of the node from this leaf index on
            is in ``entries``: 0 for its whole history, else where the
            log's pruned prefix ends or, asked ``since`` a time, the
            node's last entry before it (the anchor, which
            :func:`~verifier.protocol.translog.verify_history` accepts
            with its ``since``).
        entries: the entries and their proofs, by leaf index.
    """

    node_uuid: str
    checkpoint: str
    tree_size: int
    last: int | None
    complete_from: int
    entries: tuple[translog.HistoryProof, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "node_uuid": self.node_uuid,
            "checkpoint": self.checkpoint,
            "tree_size": self.tree_size,
            "last": self.last,
            "complete_from": self.complete_from,
            "entries": [item.to_dict() for item in self.entries],
        }


class LogReader:
    """Reads of the log (thread-safe; call from a worker thread).

    Args:
        engine: the verifier database.
    """

    def __init__(self, engine: sa.Engine) -> None:
        self._engine = engine

    def backlog(self) -> tuple[int, int, float | None]:
        """The log's size (entries in the signed tree), how many staged
        entries wait for the sequencer, and when the oldest of them was
        staged (None: none waits)."""
        waiting = sa.select(sa.func.count(), sa.func.min(LogEntryRow.created_at)).where(
            LogEntryRow.leaf_index.is_(None)
        )
        with Session(self._engine) as session:
            head = session.get(LogHead, HEAD_ID)
            count, oldest = session.execute(waiting).one()
        size = 0 if head is None else int(head.size)
        return size, int(count), (None if oldest is None else float(oldest))

    def checkpoint(self) -> str:
        """The latest signed checkpoint note.

        Raises:
            NotFoundError: the log has no head yet (no sequencer ran).
        """
        with Session(self._engine) as session:
            return _head(session).checkpoint

    def history(
        self,
        uuid: str,
        scope: str | None,
        since: float | None = None,
        until: float | None = None,
    ) -> History:
        """The entries of node ``uuid`` (created from ``since`` to
        ``until``, seconds; with ``since``, from the node's last entry
        before it) in the latest checkpoint's tree.

        Args:
            uuid: canonical node UUID.
            scope: the caller's project (None: every project); entries of
                another project's node are not there.

        Raises:
            NotFoundError: no entry of ``uuid`` in ``scope`` (as for a
                node never enrolled).
            RequestError: more than :data:`MAX_ENTRIES` entries.
        """
        with Session(self._engine) as session, session.begin():
            head = _head(session)
            mine = [LogEntryRow.node_uuid == uuid, LogEntryRow.leaf_index < head.size]
            if scope is not None:
                mine.append(LogEntryRow.project_id == scope)
            last = session.scalar(
                sa.select(sa.func.max(LogEntryRow.leaf_index)).where(*mine)
            )
            if last is None:
                raise NotFoundError("unknown_node", f"node {uuid} has no history")
            start = head.pruned_below
            if since is not None:  # from the anchor: its last entry before
                anchor = session.scalar(
                    sa.select(sa.func.max(LogEntryRow.leaf_index)).where(
                        *mine, LogEntryRow.created_at < since
                    )
                )
                start = max(start, 0 if anchor is None else anchor)
            query = sa.select(LogEntryRow.body).where(
                *mine, LogEntryRow.leaf_index >= start, LogEntryRow.body.is_not(None)
            )
            if until is not None:
                query = query.where(LogEntryRow.created_at <= until)
            bodies = list(
                session.scalars(
                    query.order_by(LogEntryRow.leaf_index).limit(MAX_ENTRIES + 1)
                )
            )
            if len(bodies) > MAX_ENTRIES:
                raise RequestError(
                    "since", f"more than {MAX_ENTRIES} entries: ask for a shorter range"
                )
            entries = [translog.LogEntry.from_bytes(body) for body in bodies if body]
            proofs = _proofs(session, [e.index for e in entries], head.size)
            note, size = head.checkpoint, head.size
        items = tuple(
            translog.HistoryProof(entry, tuple(proof))
            for entry, proof in zip(entries, proofs, strict=True)
        )
        return History(uuid, note, size, last, start, items)

    def consistency(self, old: int, new: int) -> list[bytes]:
        """The consistency proof from the tree of size ``old`` to ``new``.

        Raises:
            RequestError: ``from`` or ``to`` out of range (400 naming it).
        """
        with Session(self._engine) as session, session.begin():
            size = _head(session).size
            if not 0 <= new <= size:
                raise RequestError("to", f"to must be from 0 to the log's size {size}")
            if not 0 <= old <= new:
                raise RequestError("from", f"from must be from 0 to to ({new})")
            get = _getter(session, lambda g: translog.consistency_proof(old, new, g))
            return translog.consistency_proof(old, new, get)


def _head(session: Session) -> LogHead:
    head = session.get(LogHead, HEAD_ID)
    if head is None:
        raise NotFoundError("no_log", "the attestation log has no checkpoint yet")
    return head


def _proofs(session: Session, indices: Sequence[int], size: int) -> list[list[bytes]]:
    def every(get: translog.NodeGetter) -> list[list[bytes]]:
        return [translog.inclusion_proof(i, size, get) for i in indices]

    return every(_getter(session, every))


def _getter(
    session: Session, compute: Callable[[translog.NodeGetter], object]
) -> translog.NodeGetter:
    """A getter holding every stored hash ``compute`` asks for."""
    wanted: set[tuple[int, int]] = set()

    def record(level: int, index: int) -> bytes:
        wanted.add((level, index))
        return _ZERO

    compute(record)
    hashes = _fetch(session, wanted)

    def get(level: int, index: int) -> bytes:
        return hashes[(level, index)]

    return get


def _fetch(
    session: Session, keys: Iterable[tuple[int, int]]
) -> dict[tuple[int, int], bytes]:
    """The stored hashes of ``keys`` (those missing are left out)."""
    by_level: dict[int, list[int]] = {}
    for level, index in keys:
        by_level.setdefault(level, []).append(index)
    out: dict[tuple[int, int], bytes] = {}
    for level, indices in by_level.items():
        for start in range(0, len(indices), 500):
            query = sa.select(LogNode.idx, LogNode.hash).where(
                LogNode.level == level, LogNode.idx.in_(indices[start : start + 500])
            )
            for index, digest in session.execute(query):
                out[(level, index)] = digest
    return out
