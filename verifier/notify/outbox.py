"""The transactional outbox of revocation events, and its listing
(``GET /v1/events``: filters and pages of
:mod:`verifier.protocol.messages.event_query`)."""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import uuid as uuid_mod
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from cryptography.hazmat.primitives.asymmetric import ed25519
from sqlalchemy.orm import Session

from verifier.db import OutboxEvent
from verifier.notify.base import Notifier, NotifierError
from verifier.protocol import RevocationEvent, SignedEvent
from verifier.protocol.errors import FieldError
from verifier.protocol.events import NODE_REVOKED
from verifier.protocol.messages.event_query import EventQuery, format_time

LOG = logging.getLogger(__name__)
#: The longest reason the outbox row keeps in its column (the longest a
#: query may name); a longer one stays only in the signed body.
REASON_MAX = 64


@dataclasses.dataclass(frozen=True)
class EventPage:
    """A page of the listing.

    Attributes:
        events: the entries (newest first), as the API answers them.
        next_marker: the marker of the next page, or None when there is
            no more (the id of the last row read, which may be one the
            kind or reason filter skipped).
    """

    events: list[dict[str, Any]]
    next_marker: str | None


def _entry(row: OutboxEvent) -> dict[str, Any]:
    """An outbox row as the listing shows it: the signed event and its
    delivery state, and the event's fields at top level for readers that
    do not verify (``created_at``: when the row was stored, ISO 8601)."""
    signed = json.loads(row.body)
    event = signed.get("event", {})
    return {
        "id": row.id,
        "node_uuid": row.node_uuid,
        "type": event.get("type", NODE_REVOKED),
        "reason": event.get("reason", ""),
        "detail": event.get("detail", ""),
        "created_at": format_time(row.created_at),
        "signed_event": signed,
        "delivered": row.delivered_at is not None,
        "attempts": row.attempts,
        "last_error": row.last_error,
    }


def make_event(
    signing_key: ed25519.Ed25519PrivateKey,
    node_uuid: str,
    reason: str,
    detail: str,
    now: float,
    kind: str = NODE_REVOKED,
) -> SignedEvent:
    """A new signed event of type ``kind`` (one of ``EVENT_TYPES``) for
    ``node_uuid``."""
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
    event = RevocationEvent(
        str(uuid_mod.uuid4()), node_uuid, reason, detail, created, kind
    )
    return event.sign(signing_key)


def add_to_outbox(
    session: Session, signed: SignedEvent, now: float, project_id: str = ""
) -> None:
    """Stage ``signed`` (about a node of ``project_id``) in the caller's
    transaction."""
    session.add(OutboxEvent(**outbox_values(signed, now, project_id)))


def outbox_values(
    signed: SignedEvent, now: float, project_id: str = ""
) -> dict[str, object]:
    """The outbox row of ``signed`` (for many at once: one INSERT of
    several rows in the caller's transaction)."""
    return {
        "id": signed.event.id,
        "node_uuid": signed.event.node_uuid,
        "project_id": project_id,
        "body": signed.to_json(),
        "created_at": now,
        "attempts": 0,
        "type": signed.event.type,
        "reason": reason if len(reason := signed.event.reason) <= REASON_MAX else None,
    }


class Outbox:
    """Delivers undelivered outbox events to every notifier.

    An event is marked delivered only when every notifier acknowledged
    it. Within one process, a notifier that already acknowledged an event
    is not asked again while the others are retried (after a restart every
    notifier gets it again: consumers deduplicate on the event id). A
    failed event waits ``retry_delay`` seconds before its next try,
    doubled after each further failure up to ``max_retry_delay``.

    Args:
        engine: the verifier database.
        notifiers: the configured drivers; an event is delivered when all
            of them acknowledged it.
        clock: returns the current time (seconds).
        retry_delay: back-off after the first failed try (0: retry on
            every pass).
        max_retry_delay: upper bound of the back-off.
    """

    def __init__(
        self,
        engine: sa.Engine,
        notifiers: Sequence[Notifier],
        clock: Callable[[], float] = time.time,
        retry_delay: float = 0.0,
        max_retry_delay: float = 60.0,
    ) -> None:
        self._engine = engine
        self._notifiers = list(notifiers)
        self._clock = clock
        self._retry_delay = retry_delay
        self._max_retry_delay = max_retry_delay
        # event id -> names of the notifiers that acknowledged it
        self._acked: dict[str, set[str]] = {}
        # event id -> (failures in this process, earliest next try)
        self._backoff: dict[str, tuple[int, float]] = {}

    def dispatch_once(
        self, limit: int = 100, owns: Callable[[str], bool] | None = None
    ) -> int:
        """One delivery pass. Returns the number of events delivered.

        Args:
            limit: at most this many events.
            owns: deliver only events of nodes for which this returns True
                (several verifiers share one outbox; each delivers its own).
        """
        with Session(self._engine) as session:
            rows = session.scalars(
                sa.select(OutboxEvent)
                .where(OutboxEvent.delivered_at.is_(None))
                .order_by(OutboxEvent.created_at)
                .limit(limit * 10 if owns else limit)
            ).all()
            now = self._clock()
            pending = [
                (row.id, row.body)
                for row in rows
                if (owns is None or owns(row.node_uuid))
                and self._backoff.get(row.id, (0, 0.0))[1] <= now
            ][:limit]
        delivered = 0
        for event_id, body in pending:
            error = self._deliver(event_id, json.loads(body))
            with Session(self._engine) as session, session.begin():
                row = session.get(OutboxEvent, event_id)
                if row is None:
                    continue
                row.attempts += 1
                if error is None:
                    row.delivered_at = self._clock()
                    row.last_error = None
                    delivered += 1
                else:
                    row.last_error = error
            if error is None:
                self._acked.pop(event_id, None)
                self._backoff.pop(event_id, None)
            elif self._retry_delay > 0:
                failures = self._backoff.get(event_id, (0, 0.0))[0] + 1
                delay = min(
                    self._max_retry_delay, self._retry_delay * 2 ** (failures - 1)
                )
                self._backoff[event_id] = (failures, self._clock() + delay)
        return delivered

    def _deliver(self, event_id: str, event: dict[str, object]) -> str | None:
        errors = []
        acked = self._acked.setdefault(event_id, set())
        for notifier in self._notifiers:
            if notifier.name in acked:
                continue
            try:
                if notifier.deliver(event):
                    acked.add(notifier.name)
                else:
                    errors.append(f"{notifier.name}: not acknowledged")
            except NotifierError as exc:
                errors.append(str(exc))
        if errors:
            LOG.warning(
                "Revocation event %s not delivered: %s",
                event.get("event"),
                "; ".join(errors),
            )
            return "; ".join(errors)
        return None

    def prune(self, before: float) -> int:
        """Delete the delivered events created before ``before`` (event
        retention); an undelivered event stays whatever its age. Returns
        how many were deleted."""
        with Session(self._engine) as session, session.begin():
            result = session.execute(
                sa.delete(OutboxEvent).where(
                    OutboxEvent.delivered_at.is_not(None),
                    OutboxEvent.created_at < before,
                )
            )
            return int(result.rowcount or 0)  # type: ignore[attr-defined]

    def backlog(self) -> tuple[int, float | None]:
        """How many events are undelivered, and when the oldest of them was
        created (None: none is)."""
        query = sa.select(sa.func.count(), sa.func.min(OutboxEvent.created_at))
        with Session(self._engine) as session:
            count, oldest = session.execute(
                query.where(OutboxEvent.delivered_at.is_(None))
            ).one()
        return int(count), (None if oldest is None else float(oldest))

    def close(self) -> None:
        """Close every notifier's connections."""
        for notifier in self._notifiers:
            notifier.close()

    def list(
        self, node_uuid: str | None = None, project: str | None = None
    ) -> list[dict[str, Any]]:
        """Every outbox entry (oldest first) with its delivery state: of
        one node or all, of one project or all."""
        with Session(self._engine) as session:
            query = sa.select(OutboxEvent).order_by(
                OutboxEvent.created_at, OutboxEvent.id
            )
            if node_uuid is not None:
                query = query.where(OutboxEvent.node_uuid == node_uuid)
            if project is not None:
                query = query.where(OutboxEvent.project_id == project)
            return [_entry(row) for row in session.scalars(query)]

    def page(self, query: EventQuery, project: str | None = None) -> EventPage:
        """One page of the listing, newest first (ties on the time broken
        by the id, so that pages never skip nor repeat an event).

        Every filter is applied in SQL (the row keeps its event's type and
        reason in columns since alembic 0013); the page is read in one
        query of ``limit + 1`` rows.

        Args:
            query: the filters and the page.
            project: only this project's events (None: every project's).

        Raises:
            FieldError: ``marker`` names no event the caller may see.
        """
        with Session(self._engine) as session:
            select = self._select(session, query, project)
            rows = iter(session.scalars(select.limit(query.limit + 1)))
            return _fill(rows, query, query.limit)

    def _select(
        self, session: Session, query: EventQuery, project: str | None
    ) -> sa.Select[Any]:
        table = OutboxEvent
        select = sa.select(table).order_by(table.created_at.desc(), table.id.desc())
        if project is not None:
            select = select.where(table.project_id == project)
        if query.node is not None:
            select = select.where(table.node_uuid == query.node)
        if query.kind is not None:
            select = select.where(table.type == query.kind)
        if query.reason is not None:
            select = select.where(table.reason == query.reason)
        if query.since is not None:
            select = select.where(table.created_at >= query.since)
        if query.until is not None:
            select = select.where(table.created_at < query.until)
        if query.marker is not None:
            mark = session.get(table, query.marker)
            if mark is None or (project is not None and mark.project_id != project):
                raise FieldError("event query", "marker", "names no event")
            select = select.where(
                sa.or_(
                    table.created_at < mark.created_at,
                    sa.and_(table.created_at == mark.created_at, table.id < mark.id),
                )
            )
        return select


def _fill(rows: Iterator[OutboxEvent], query: EventQuery, budget: int) -> EventPage:
    """Up to ``query.limit`` matching entries of ``rows`` (read at most
    ``budget`` of them), and the next marker if a row is left."""
    found: list[dict[str, Any]] = []
    last: str | None = None
    for scanned, row in enumerate(rows, 1):
        last = row.id
        entry = _entry(row)
        if query.matches(entry["type"], entry["reason"]):
            found.append(entry)
        if len(found) == query.limit or scanned == budget:
            more = next(rows, None) is not None
            return EventPage(found, last if more else None)
    return EventPage(found, None)
