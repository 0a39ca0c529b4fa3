"""The attestation log's sequencer: staged entries become leaves.

One pass takes the head row's lock (an UPDATE of the row: a row lock on
PostgreSQL and MySQL, the database's write lock on SQLite), so that of
several verifier processes sharing the database one appends at a time.
It gives the staged rows, in staging order, dense leaf indices from the
head's size on, each the index of its node's previous entry (``prev``),
writes their canonical bytes (:class:`~verifier.protocol.translog.LogEntry`),
appends their leaf hashes to the tree's right edge
(:class:`~verifier.protocol.translog.Frontier`), stores every perfect
subtree completed, and signs a new checkpoint (C2SP tlog-checkpoint) with
the verifier's event key, named and with the origin
:func:`~verifier.protocol.translog.log_origin` of its public key. All in
one transaction: a crash leaves the log as it was.

Retention (:meth:`LogSequencer.prune`) clears the bodies of a prefix of
the log (entries older than the retention); the tree's hashes stay, so
the proofs of younger entries still work.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence

import sqlalchemy as sa
from cryptography.hazmat.primitives.asymmetric import ed25519
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from verifier.db import LogEntryRow, LogHead, LogNode
from verifier.protocol import translog

__all__ = ["HEAD_ID", "LogSequencer"]

#: The head's one row.
HEAD_ID = 1


class LogSequencer:
    """Appends staged entries to the log and signs its checkpoints.

    Args:
        engine: the verifier database (shared by every verifier process).
        signing_key: the verifier's event key (signs the checkpoints).
        clock: wall clock (seconds).
        batch: at most this many entries per transaction.
    """

    def __init__(
        self,
        engine: sa.Engine,
        signing_key: ed25519.Ed25519PrivateKey,
        clock: Callable[[], float] = time.time,
        batch: int = 2000,
    ) -> None:
        self._engine = engine
        self._key = signing_key
        self._clock = clock
        self._batch = batch
        self.origin = translog.log_origin(signing_key.public_key())

    def _sign(self, size: int, root: bytes) -> str:
        checkpoint = translog.Checkpoint(self.origin, size, root)
        return translog.sign_checkpoint(checkpoint, self._key, self.origin)

    def ensure_head(self) -> None:
        """Create the empty log's head unless there is one (whoever of
        several processes comes first)."""
        with Session(self._engine) as session:
            if session.get(LogHead, HEAD_ID) is not None:
                return
        empty = translog.Frontier()
        head = LogHead(
            id=HEAD_ID,
            size=0,
            frontier=json.dumps(empty.to_dict()),
            root=empty.root(),
            checkpoint=self._sign(0, empty.root()),
            pruned_below=0,
            updated_at=self._clock(),
        )
        try:
            with Session(self._engine) as session, session.begin():
                session.add(head)
        except IntegrityError:  # another process created it meanwhile
            pass

    def sequence_once(self) -> int:
        """Append up to ``batch`` staged entries (one transaction).

        Returns:
            How many were appended (0: none was staged).
        """
        self.ensure_head()
        if not self._staged():  # idle: no lock taken, nothing written
            return 0
        with Session(self._engine) as session, session.begin():
            head = _lock_head(session)
            rows = list(
                session.scalars(
                    sa.select(LogEntryRow)
                    .where(LogEntryRow.leaf_index.is_(None))
                    .order_by(LogEntryRow.id)
                    .limit(self._batch)
                )
            )
            if not rows:
                return 0
            frontier = translog.Frontier.from_dict(json.loads(head.frontier))
            last = _last_indices(session, {row.node_uuid for row in rows})
            nodes: list[tuple[int, int, bytes]] = []
            sequenced: list[dict[str, object]] = []
            for row in rows:
                entry = _entry(row, frontier.size, last.get(row.node_uuid))
                body = entry.to_bytes()
                sequenced.append(
                    {
                        "id": row.id,
                        "leaf_index": entry.index,
                        "prev_index": entry.prev,
                        "body": body,
                        "reason": None,
                        "detail": None,
                        "event_id": None,
                    }
                )
                last[row.node_uuid] = entry.index
                nodes.extend(frontier.append(translog.leaf_hash(body)))
            session.expunge_all()  # written below, by primary key in bulk
            # the entries first: their unique leaf index guards the tree
            session.execute(sa.update(LogEntryRow), sequenced)
            _insert_nodes(session, nodes)
            head = session.get_one(LogHead, HEAD_ID)
            head.size, head.root = frontier.size, frontier.root()
            head.frontier = json.dumps(frontier.to_dict())
            head.checkpoint = self._sign(head.size, head.root)
            head.updated_at = self._clock()
            return len(rows)

    def _staged(self) -> bool:
        """Whether an entry waits to be sequenced (no lock)."""
        query = sa.select(LogEntryRow.id).where(LogEntryRow.leaf_index.is_(None))
        with self._engine.connect() as conn:
            return conn.execute(query.limit(1)).first() is not None

    def sequence_all(self) -> int:
        """Append every staged entry; returns how many."""
        total = 0
        while count := self.sequence_once():
            total += count
        return total

    def prune(self, before: float) -> int:
        """Clear the bodies of the log's prefix of entries created before
        ``before`` (seconds since the epoch): every entry up to the last
        one older than that, so that the pruned part is a prefix (the
        head's ``pruned_below``, the history's ``complete_from``).

        Returns:
            The first leaf index still complete.
        """
        self.ensure_head()
        with Session(self._engine) as session, session.begin():
            head = _lock_head(session)
            cut = session.scalar(
                sa.select(sa.func.max(LogEntryRow.leaf_index)).where(
                    LogEntryRow.created_at < before,
                    LogEntryRow.leaf_index.is_not(None),
                )
            )
            if cut is None or cut < head.pruned_below:
                return head.pruned_below
            session.execute(
                sa.update(LogEntryRow)
                .where(
                    LogEntryRow.leaf_index >= head.pruned_below,
                    LogEntryRow.leaf_index <= cut,
                )
                .values(body=None, pruned=True)
                .execution_options(synchronize_session=False)
            )
            head.pruned_below = cut + 1
            return head.pruned_below


def _lock_head(session: Session) -> LogHead:
    """The head row, locked for this transaction."""
    session.execute(
        sa.update(LogHead)
        .where(LogHead.id == HEAD_ID)
        .values(size=LogHead.size)
        .execution_options(synchronize_session=False)
    )
    return session.scalars(
        sa.select(LogHead).where(LogHead.id == HEAD_ID).with_for_update()
    ).one()


def _last_indices(session: Session, uuids: set[str]) -> dict[str, int]:
    """uuid -> the leaf index of its last sequenced entry."""
    out: dict[str, int] = {}
    chunk = sorted(uuids)
    for start in range(0, len(chunk), 500):
        query = (
            sa.select(LogEntryRow.node_uuid, sa.func.max(LogEntryRow.leaf_index))
            .where(
                LogEntryRow.node_uuid.in_(chunk[start : start + 500]),
                LogEntryRow.leaf_index.is_not(None),
            )
            .group_by(LogEntryRow.node_uuid)
        )
        for uuid, index in session.execute(query):
            if index is not None:
                out[uuid] = index
    return out


def _entry(row: LogEntryRow, index: int, prev: int | None) -> translog.LogEntry:
    """The canonical entry of the staged ``row`` at leaf ``index``."""
    return translog.LogEntry(
        index=index,
        prev=prev,
        node_uuid=row.node_uuid,
        project_id=row.project_id[: translog.MAX_TEXT],
        kind=translog.EntryKind(row.kind),
        reason=(row.reason or "")[: translog.MAX_TEXT],
        detail=(row.detail or "")[: translog.MAX_DETAIL],
        created_at=row.created_at,
        event_id=row.event_id,
    )


def _insert_nodes(session: Session, nodes: Sequence[tuple[int, int, bytes]]) -> None:
    if nodes:
        values = [{"level": lv, "idx": i, "hash": h} for lv, i, h in nodes]
        session.execute(sa.insert(LogNode), values)
