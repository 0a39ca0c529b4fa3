"""Policies that follow the node, and changes of the policies in force.

A node enrolled with a bare policy name (``--runtime-policy web``) follows
it: the newest version of ``web`` in the node's project is in force, now
and whenever a newer one is added; ``web@4`` or a digest pins that one
(:func:`verifier.attest.policies.follows`). Its tenant may change either
later (``PUT /v1/nodes/{uuid}/policy``).

:class:`PolicySwitch` makes both kinds of change: in the database (the
node's digest in force, and one signed ``node.policy_changed`` event per
node and kind in the same transaction, reason ``follow`` or ``set``, with
its attestation log entry), then
in the live nodes this process attests, which judge with the new policy
from their next quote on without resetting their IMA replay
(:meth:`~verifier.attest.node.LiveNode.use`). Nodes another verifier
process attests take the change from the database at its next sync
(:class:`~verifier.attest.membership.OwnershipSync`), as deletions and
revocations reach them. Calls only down: the store's engine, the policy
store, the live map and the outbox pump.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any

import sqlalchemy as sa
from cryptography.hazmat.primitives.asymmetric import ed25519
from sqlalchemy.orm import Session

from verifier.attest.delivery import OutboxPump
from verifier.attest.node import NodeState
from verifier.attest.policies import MEASURED_BOOT, RUNTIME, PolicyStore
from verifier.attest.registry import LiveNodes
from verifier.attest.store import NodeStore
from verifier.db import LogEntryRow, Node, OutboxEvent
from verifier.notify.outbox import add_to_outbox, make_event, outbox_values
from verifier.protocol.events import NODE_POLICY_CHANGED, PolicyChange
from verifier.tlog import POLICY_CHANGED, Staged, log_values, stage_note

__all__ = ["FOLLOW", "SET", "PolicySwitch", "Switched"]

LOG = logging.getLogger(__name__)

#: The reasons of a ``node.policy_changed`` event.
FOLLOW, SET = "follow", "set"
#: Per kind, the node's columns: the digest in force and the name followed.
_COLUMNS = {
    RUNTIME: (Node.runtime_policy, Node.runtime_policy_follow),
    MEASURED_BOOT: (Node.mb_policy, Node.mb_policy_follow),
}
_REVOKED = NodeState.REVOKED.value
#: Nodes switched per UPDATE statement.
_CHUNK = 500
_Pair = tuple[str | None, str | None]


@dataclasses.dataclass(frozen=True)
class Switched:
    """A node whose policies changed: its digests in force (runtime,
    measured boot) and the names they follow, as written, and the digests
    they replaced (``old``)."""

    uuid: str
    refs: _Pair
    follows: _Pair
    old: _Pair


class PolicySwitch:
    """Changes the policies in force on nodes.

    Args:
        store: the node table (its engine; the outbox is beside it).
        nodes: the nodes this process attests.
        policies: the stored policies.
        signing_key: signs the events.
        clock: wall clock (seconds).
        pump: woken when events were committed.
    """

    def __init__(
        self,
        store: NodeStore,
        nodes: LiveNodes,
        policies: PolicyStore,
        signing_key: ed25519.Ed25519PrivateKey,
        clock: Callable[[], float],
        pump: OutboxPump,
    ) -> None:
        self._engine = store.engine
        self._nodes = nodes
        self._policies = policies
        self._key = signing_key
        self._clock = clock
        self._pump = pump

    async def new_version(self, kind: str, project: str, name: str) -> int:
        """A version of ``kind`` policy ``name`` was added to ``project``:
        every node of the project that follows ``name`` switches to its
        newest version (one added below the newest changes nothing).

        Returns:
            the number of nodes switched.

        Raises:
            NotFoundError: no policy ``name`` (deleted meanwhile).
        """
        digest, switched = await asyncio.to_thread(self._follow, kind, project, name)
        if switched:
            self._pump.wake()  # their events
            await asyncio.to_thread(self._policies.load, digest)
        self._apply(switched)
        if switched:
            LOG.info(
                "%d node(s) of project %s follow %s policy %r to %s",
                len(switched),
                project,
                kind,
                name,
                digest,
            )
        return len(switched)

    async def set_policies(
        self, uuid: str, project: str, changes: Mapping[str, tuple[str | None, ...]]
    ) -> Switched | None:
        """Set the policies of node ``uuid`` of ``project``: ``changes``
        maps a kind to ``(digest, followed name)`` (None, None: no policy of
        that kind; with a name, its newest version when written); kinds not
        named are unchanged.

        Returns:
            the node's policies as written, None if it is gone or revoked.
        """
        switched = await asyncio.to_thread(self._set, uuid, project, changes)
        if switched is not None:
            digests = [d for d in switched.refs if d is not None]
            await asyncio.to_thread(self._policies.load_many, digests)
            if switched.refs != switched.old:
                self._pump.wake()  # its events
            self._apply([switched])
        return switched

    # -- the database (worker threads) ----------------------------------------

    def _follow(self, kind: str, project: str, name: str) -> tuple[str, list[Switched]]:
        """Switch the nodes following ``name`` to its newest version, with
        their events, in one transaction (their rows locked where the
        database can; the newest version read in it, so that two versions
        added at once leave every node on the newer one).

        Returns:
            the newest version's digest and the nodes switched.
        """
        now = self._clock()
        with Session(self._engine) as session, session.begin():
            _write_lock(session)
            digest, _ = self._policies.newest(kind, name, project, session)
            return digest, self._switch_following(
                session, kind, project, name, digest, now
            )

    def _switch_following(
        self,
        session: Session,
        kind: str,
        project: str,
        name: str,
        digest: str,
        now: float,
    ) -> list[Switched]:
        """In ``session``'s transaction: the nodes following ``name`` that
        do not hold ``digest`` get it, each with its signed event."""
        column, follow = _COLUMNS[kind]
        query = (
            sa.select(
                Node.uuid,
                Node.runtime_policy,
                Node.mb_policy,
                Node.runtime_policy_follow,
                Node.mb_policy_follow,
            )
            .where(
                Node.project_id == project,
                follow == name,
                Node.state != _REVOKED,
                sa.or_(column.is_(None), column != digest),
            )
            .with_for_update()
        )
        rows = session.execute(query).all()
        if not rows:
            return []
        index = 0 if kind == RUNTIME else 1
        olds = {(row[1], row[2])[index] for row in rows}
        names = self._names(project, {digest, *olds})
        events, entries, out = [], [], []
        for uuid, runtime, mb, runtime_follow, mb_follow in rows:
            refs: list[str | None] = [runtime, mb]
            old, refs[index] = refs[index], digest
            change = PolicyChange(
                kind, _ref(old, names), _ref(digest, names)
            ).to_detail()
            event = make_event(
                self._key, uuid, FOLLOW, change, now, NODE_POLICY_CHANGED
            )
            events.append(outbox_values(event, now, project))
            entries.append(
                log_values(
                    POLICY_CHANGED, uuid, project, FOLLOW, change, now, event.event.id
                )
            )
            follows = (runtime_follow, mb_follow)
            out.append(Switched(uuid, (refs[0], refs[1]), follows, (runtime, mb)))
        # a few statements of many rows each, not one per node
        for start in range(0, len(out), _CHUNK):
            part = [item.uuid for item in out[start : start + _CHUNK]]
            session.execute(
                sa.update(Node)
                .where(Node.uuid.in_(part))
                .values({column: digest, Node.updated_at: now})
                .execution_options(synchronize_session=False)
            )
        session.execute(sa.insert(OutboxEvent), events)
        session.execute(sa.insert(LogEntryRow), entries)
        return out

    def _set(
        self, uuid: str, project: str, changes: Mapping[str, tuple[str | None, ...]]
    ) -> Switched | None:
        now = self._clock()
        with Session(self._engine) as session, session.begin():
            _write_lock(session)
            row = session.scalars(
                sa.select(Node).where(Node.uuid == uuid).with_for_update()
            ).first()
            if row is None or row.state == _REVOKED:
                return None
            olds = [row.runtime_policy, row.mb_policy]
            for kind, (digest, name) in changes.items():
                column, follow = _COLUMNS[kind]
                if name is not None:  # a version added meanwhile is the newest
                    digest, _ = self._policies.newest(kind, name, project, session)
                old = getattr(row, column.key)
                setattr(row, column.key, digest)
                setattr(row, follow.key, name)
                if old != digest:
                    names = self._names(project, {old, digest})
                    change = PolicyChange(kind, _ref(old, names), _ref(digest, names))
                    event = make_event(
                        self._key,
                        uuid,
                        SET,
                        change.to_detail(),
                        now,
                        NODE_POLICY_CHANGED,
                    )
                    add_to_outbox(session, event, now, project)
                    note = Staged(
                        POLICY_CHANGED, SET, event.event.detail, event.event.id
                    )
                    stage_note(session, note, uuid, project, now)
            row.updated_at = now
            return Switched(
                uuid,
                (row.runtime_policy, row.mb_policy),
                (row.runtime_policy_follow, row.mb_policy_follow),
                (olds[0], olds[1]),
            )

    def _names(
        self, project: str, digests: set[str | None]
    ) -> dict[str, tuple[str, int]]:
        pairs = [(project, d) for d in digests if d is not None]
        return {d: nv for (_, d), nv in self._policies.names(pairs).items()}

    # -- the live nodes (the event loop) ---------------------------------------

    def _apply(self, switched: list[Switched]) -> None:
        """The live nodes judge with their new policies from their next
        quote on (their policies were loaded)."""
        cached = self._policies.cached
        for item in switched:
            node = self._nodes.find(item.uuid)
            if node is None or node.state == NodeState.REVOKED:
                continue
            # a later change taken meanwhile (committed after this one) wins
            if (node.runtime_ref, node.mb_ref) == item.old:
                node.use(item.refs, item.follows, cached)


def _write_lock(session: Session) -> None:
    """Take the database's write lock before the transaction reads: SQLite
    (whose driver begins a transaction only at its first write) would
    otherwise let two switches read the same rows and both write them,
    each with its events. Elsewhere this writes nothing and locks nothing
    (the rows read are locked with ``FOR UPDATE``)."""
    session.execute(
        sa.update(Node)
        .where(sa.false())
        .values(updated_at=Node.updated_at)
        .execution_options(synchronize_session=False)
    )


def _ref(
    digest: str | None, names: Mapping[str, tuple[str, int]]
) -> dict[str, Any] | None:
    """A policy as a :class:`PolicyChange` names it."""
    if digest is None:
        return None
    name, version = names.get(digest, ("", 0))
    return {"name": name, "version": version, "digest": digest}
