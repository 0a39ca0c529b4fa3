"""The verifier's node table, written so that several verifier processes
can share it: a revoked node is never written back to another state, and a
revocation (with its outbox event) is committed exactly once.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, load_only

from verifier.attest.quotas import Quotas
from verifier.db import Node
from verifier.exceptions import ConflictError, RequestError
from verifier.notify.outbox import add_to_outbox
from verifier.protocol import SignedEvent
from verifier.protocol.attestation import NodeAttestation, NodeState, Transition
from verifier.tlog import REVOKED, Staged, stage_note

_REVOKED = NodeState.REVOKED.value
_NODES: sa.Table = Node.__table__  # type: ignore[assignment]


@functools.lru_cache(maxsize=128)
def _state_update(keys: tuple[str, ...], entering: bool) -> sa.Update:
    """The statement that writes a node's state change: columns ``keys``
    from the parameters ``v_KEY``, of the node ``w_uuid`` unless it is
    revoked (``entering``: also unless it is in ``w_entering`` already).

    Built once per set of columns (a handful in all) on the table itself,
    not the ORM entity: a transition is written on the event loop, and the
    ORM's bulk update built, cache-keyed and resolved the statement anew
    for each (10 ms of CPU per transition in a boot storm's profile)."""
    table = _NODES
    update = sa.update(table).where(
        table.c.uuid == sa.bindparam("w_uuid"), table.c.state != _REVOKED
    )
    if entering:
        update = update.where(table.c.state != sa.bindparam("w_entering"))
    return update.values(
        {key: sa.bindparam(f"v_{key}", type_=table.c[key].type) for key in keys}
    )


_WAITING = (NodeState.PENDING.value, NodeState.CREATED.value)
#: UUIDs per SQL ``IN`` list of a batch (:meth:`NodeStore.insert_many`).
_IN_CHUNK = 500
#: Nodes and the hot state to write behind for each (:meth:`NodeStore.hot_rows`).
HotRows = list[tuple[NodeAttestation, dict[str, Any]]]


class NodeStore:
    """Reads and conditional writes of ``verifier_nodes``.

    Args:
        engine: the shared database.
        clock: wall clock (seconds).
        quotas: per-project limits checked on insert (default: none).
    """

    def __init__(
        self,
        engine: sa.Engine,
        clock: Callable[[], float] = time.time,
        quotas: Quotas | None = None,
    ):
        self.engine = engine
        self._clock = clock
        self._quotas = quotas or Quotas()

    def insert(self, row: Node) -> None:
        """Raises:
        ConflictError: the node is already enrolled.
        QuotaExceededError: its project is at its node (or pending
            enrolment) quota.
        """
        try:
            with self._quotas.lock, Session(self.engine) as session, session.begin():
                if row.project_id:
                    self._check_quotas(session, row)
                session.add(row)
        except IntegrityError:
            raise ConflictError(
                "already_enrolled", f"node {row.uuid} is already enrolled"
            )

    def insert_many(self, rows: list[Node]) -> list[RequestError | None]:
        """Insert a batch of enrolments in one transaction: each row's
        outcome, None when stored, else the error :meth:`insert` would
        raise for it alone (``already_enrolled``, a quota reached part-way
        through the batch, or the quota source unreadable); the others are
        stored all the same. Should another verifier insert one of the
        same nodes meanwhile (the transaction then fails whole), each row
        is inserted on its own instead."""
        try:
            with self._quotas.lock, Session(self.engine) as session, session.begin():
                outcome = self._add_batch(session, rows)
        except IntegrityError:
            outcome = []
            for row in rows:
                try:
                    self.insert(row)
                    outcome.append(None)
                except RequestError as exc:
                    outcome.append(exc)
        return outcome

    def _add_batch(
        self, session: Session, rows: list[Node]
    ) -> list[RequestError | None]:
        """:meth:`insert_many`'s rows added to ``session``, quotas counted as
        they are added."""
        uuids = [row.uuid for row in rows]
        taken: set[str] = set()
        for start in range(0, len(uuids), _IN_CHUNK):
            chunk = uuids[start : start + _IN_CHUNK]
            taken.update(
                session.scalars(sa.select(Node.uuid).where(Node.uuid.in_(chunk)))
            )
        used: dict[tuple[str, str], int] = {}
        outcome: list[RequestError | None] = []
        for row in rows:
            if row.uuid in taken:
                outcome.append(
                    ConflictError(
                        "already_enrolled", f"node {row.uuid} is already enrolled"
                    )
                )
                continue
            try:
                counted = (
                    self._count_quotas(session, row, used) if row.project_id else []
                )
            except RequestError as exc:
                outcome.append(exc)
                continue
            for key in counted:
                used[key] += 1
            taken.add(row.uuid)
            session.add(row)
            outcome.append(None)
        return outcome

    def _count_quotas(
        self, session: Session, row: Node, used: dict[tuple[str, str], int]
    ) -> list[tuple[str, str]]:
        """Check ``row`` against its project's quotas, with ``used`` the
        counts so far in this transaction (read from the table the first
        time a project's is needed); returns the counts the row adds to.

        Raises: QuotaExceededError, RequestError (as :meth:`insert`).
        """
        project = row.project_id
        mine = sa.select(sa.func.count()).where(Node.project_id == project)
        keys = [(project, "nodes")]
        if row.state in _WAITING:
            keys.append((project, "pending_enrolments"))
        for key in keys:
            if key not in used:
                query = (
                    mine if key[1] == "nodes" else mine.where(Node.state.in_(_WAITING))
                )
                used[key] = session.scalar(query) or 0
            self._quotas.check(key[1], used[key], project=project)
        return keys

    def _check_quotas(self, session: Session, row: Node) -> None:
        mine = sa.select(sa.func.count()).where(Node.project_id == row.project_id)
        project = row.project_id
        self._quotas.check("nodes", session.scalar(mine) or 0, project=project)
        if row.state in _WAITING:
            waiting = mine.where(Node.state.in_(_WAITING))
            used = session.scalar(waiting) or 0
            self._quotas.check("pending_enrolments", used, project=project)

    def load(self, uuid: str) -> Node | None:
        with Session(self.engine) as session:
            row = session.get(Node, uuid)
            if row is not None:
                session.expunge(row)
            return row

    def load_many(self, uuids: list[str], chunk: int = 500) -> list[Node]:
        """The rows of ``uuids`` (those that still exist)."""
        rows: list[Node] = []
        with Session(self.engine) as session:
            for i in range(0, len(uuids), chunk):
                part = uuids[i : i + chunk]
                rows.extend(session.scalars(sa.select(Node).where(Node.uuid.in_(part))))
            session.expunge_all()
        return rows

    def load_all(
        self, project: str | None = None, columns: Sequence[Any] = ()
    ) -> list[Node]:
        """Every tenant's node, or those of ``project`` (never a compute
        host: hosts are :mod:`verifier.attest.hosts`'); with ``columns``
        (the model's attributes) only those are loaded, and reading any
        other raises (a list of thousands of nodes then leaves their
        certificates, keys and shares in the database)."""
        query = sa.select(Node).where(Node.kind != "host").order_by(Node.uuid)
        if columns:
            query = query.options(load_only(*columns, raiseload=True))
        if project is not None:
            query = query.where(Node.project_id == project)
        with Session(self.engine) as session:
            rows = list(session.scalars(query))
            session.expunge_all()
            return rows

    def states(self, guests_only: bool = False) -> dict[str, str]:
        """uuid -> state of every enrolled node (``guests_only``: not the
        compute hosts)."""
        query = sa.select(Node.uuid, Node.state)
        if guests_only:
            query = query.where(Node.kind != "host")
        with self.engine.connect() as conn:
            return {uuid: state for uuid, state in conn.execute(query)}

    def policy_refs(
        self,
    ) -> dict[str, tuple[tuple[str | None, str | None], tuple[str | None, str | None]]]:
        """uuid -> (runtime and measured-boot policy digests in force, the
        names they follow) of every enrolled node."""
        query = sa.select(
            Node.uuid,
            Node.runtime_policy,
            Node.mb_policy,
            Node.runtime_policy_follow,
            Node.mb_policy_follow,
        )
        with self.engine.connect() as conn:
            return {
                uuid: ((runtime, mb), (runtime_follow, mb_follow))
                for uuid, runtime, mb, runtime_follow, mb_follow in conn.execute(query)
            }

    def _hot(self, node: NodeAttestation) -> dict[str, Any]:
        hot = node.snapshot()
        values: dict[str, Any] = {
            "last_attested_at": hot.last_attested_at,
            "quotes_verified": hot.quotes_verified,
            "updated_at": self._clock(),
        }
        if hot.ima is not None:
            values["ima_count"] = hot.ima.count
            values["ima_pcr"] = hot.ima.sha1 + hot.ima.sha256
        if hot.clock is not None:
            values["reset_count"] = hot.clock.reset_count
            values["restart_count"] = hot.clock.restart_count
            values["clock"] = hot.clock.clock
        return values

    def update_state(
        self,
        node: NodeAttestation,
        change: Transition,
        event: SignedEvent | None = None,
        log: Staged | None = None,
        **extra: Any,
    ) -> bool:
        """Write ``change`` (and ``extra`` columns) and the hot state unless
        the node was revoked; with ``event`` (of a change to ``failed``)
        or ``log`` (the attestation log's entry), stage them in the same
        transaction if this write is the one that takes the node into
        ``change.state`` (once, whichever of several verifiers writes
        first).

        Returns:
            False if the row is revoked (or gone): the caller must stop.
        """
        values = self._hot(node) | {
            "state": change.state.value,
            "failure_reason": change.failure_reason,
        }
        if change.v_released:
            values["v_released"] = True
        values.update(extra)
        params = {f"v_{key}": value for key, value in values.items()}
        params["w_uuid"] = node.uuid
        keys = tuple(sorted(values))
        with Session(self.engine) as session, session.begin():
            if event is not None or log is not None:
                params["w_entering"] = change.state.value
                entered = session.execute(_state_update(keys, True), params)
                if entered.rowcount == 1:  # type: ignore[attr-defined]
                    # the event is the owning project's, as a revocation's
                    project = session.scalar(
                        sa.select(Node.project_id).where(Node.uuid == node.uuid)
                    )
                    now = self._clock()
                    if event is not None:
                        add_to_outbox(session, event, now, project or "")
                    if log is not None:
                        stage_note(session, log, node.uuid, project or "", now)
                    node.dirty = False
                    return True
            result = session.execute(_state_update(keys, False), params)
        node.dirty = False
        return result.rowcount == 1  # type: ignore[attr-defined,no-any-return]

    def revoke(
        self,
        uuid: str,
        reason: str,
        signed: SignedEvent,
        hot: NodeAttestation | None,
        log_kind: str = REVOKED,
    ) -> bool:
        """Revoke ``uuid`` and stage ``signed`` (and its log entry of
        ``log_kind``) in one transaction, once.

        Returns:
            True if this call revoked it (and the event was written); False if
            it was already revoked or is not enrolled (nothing written).
        """
        values = (self._hot(hot) if hot is not None else {}) | {
            "state": _REVOKED,
            "failure_reason": reason,
        }
        now = self._clock()
        with Session(self.engine) as session, session.begin():
            result = session.execute(
                sa.update(Node)
                .where(Node.uuid == uuid, Node.state != _REVOKED)
                .values(**values)
            )
            if result.rowcount != 1:  # type: ignore[attr-defined]
                return False
            project = session.scalar(
                sa.select(Node.project_id).where(Node.uuid == uuid)
            )
            add_to_outbox(session, signed, now, project or "")
            event = signed.event
            note = Staged(log_kind, event.reason, event.detail, event.id)
            stage_note(session, note, uuid, project or "", now)
        return True

    def flush(self, nodes: Iterable[NodeAttestation]) -> None:
        """Write behind the hot state of ``nodes`` (never un-revokes), at
        once, in the calling thread."""
        self.write_hot(self.hot_rows(nodes))

    def hot_rows(self, nodes: Iterable[NodeAttestation]) -> HotRows:
        """The hot state of the dirty ``nodes``, taken now, for
        :meth:`write_hot`; they count as clean from here on.

        Call it where the nodes change (the event loop); the write can
        then run on a worker thread while the loop goes on.
        """
        rows = []
        for node in nodes:
            if node.dirty:
                rows.append((node, self._hot(node)))
                node.dirty = False
        return rows

    def write_hot(self, rows: HotRows, chunk: int = 500) -> None:
        """Write rows of :meth:`hot_rows` (thread-safe: it reads only the
        values taken), ``chunk`` rows per transaction so that no write
        waits long for the database's lock (SQLite has one for the whole
        file). A row whose stored count of verified quotes is already
        higher is left alone: a state change written on the loop
        meanwhile (:meth:`update_state`) is newer than these values. On
        failure the nodes not written are dirty again, for the next write.
        """
        for start in range(0, len(rows), chunk):
            part = rows[start : start + chunk]
            try:
                with self.engine.begin() as conn:
                    for node, values in part:
                        conn.execute(
                            sa.update(Node)
                            .where(
                                Node.uuid == node.uuid,
                                sa.or_(
                                    Node.quotes_verified.is_(None),
                                    Node.quotes_verified <= values["quotes_verified"],
                                ),
                            )
                            .values(**values)
                        )
            except BaseException:
                for node, _ in rows[start:]:
                    node.dirty = True
                raise

    def delete(self, uuid: str) -> bool:
        with self.engine.begin() as conn:
            result = conn.execute(
                sa.delete(Node).where(Node.uuid == uuid, Node.kind != "host")
            )
        return result.rowcount == 1
