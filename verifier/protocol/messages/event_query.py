"""The query of ``GET /v1/events`` (issue 30, item 3: events you can query).

Filters: ``since`` and ``until`` (ISO 8601 with a time zone, e.g.
``2026-11-27T20:00:00Z``; ``since`` is inclusive, ``until`` exclusive),
``node`` (a node UUID), ``kind`` (an event type of
:data:`~verifier.protocol.events.EVENT_TYPES`, or its short name:
``revoked``, ``failed``, ``unreachable``, ``recovered``,
``policy_changed``) and ``reason`` (the event's machine-readable reason,
exactly). Pagination the OpenStack way: ``limit`` (default
:data:`DEFAULT_LIMIT`, at most :data:`MAX_LIMIT`) and ``marker`` (the id of
the last event of the previous page). Events come newest first.

Every refusal is a :class:`~verifier.protocol.errors.FieldError` naming the
parameter; the API answers it with a JSON 400.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import re
import uuid as uuid_mod
from collections.abc import Mapping

from verifier.protocol.errors import FieldError
from verifier.protocol.events import EVENT_TYPES

__all__ = [
    "DEFAULT_LIMIT",
    "MAX_LIMIT",
    "PARAMETERS",
    "EventQuery",
    "event_kind",
    "format_time",
    "parse_time",
]

#: Events in a page when the caller names no limit.
DEFAULT_LIMIT = 100
#: The largest page a caller may ask for.
MAX_LIMIT = 1000
#: The query parameters the listing understands.
PARAMETERS = ("since", "until", "node", "kind", "reason", "limit", "marker")
_STRUCTURE = "event query"
_REASON = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
_LIMIT = re.compile(r"^[0-9]{1,7}$")


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def parse_time(text: str, field: str = "time") -> float:
    """Seconds since the epoch of an ISO 8601 time with a time zone.

    Raises:
        FieldError: not ISO 8601, or no time zone (``field`` named).
    """
    if len(text) > 64:
        raise FieldError(_STRUCTURE, field, "is too long for a time")
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise FieldError(
            _STRUCTURE, field, f"is not an ISO 8601 time: {text[:64]!r}"
        ) from None
    if when.tzinfo is None or when.utcoffset() is None:
        raise FieldError(
            _STRUCTURE, field, "needs a time zone (e.g. 2026-11-27T20:00:00Z)"
        )
    return when.timestamp()


def format_time(seconds: float) -> str:
    """ISO 8601 UTC of ``seconds`` (``Z``; microseconds only if any),
    rounded down to the microsecond: a time read back as ``since`` never
    falls after the event it was printed from (rounding to the nearest
    microsecond could, and the inclusive filter then missed it)."""
    micros = math.floor(seconds * 1_000_000)
    when = _EPOCH + datetime.timedelta(microseconds=micros)
    if when.timestamp() > seconds:  # the float's own rounding, read back
        when -= datetime.timedelta(microseconds=1)
    return when.isoformat().replace("+00:00", "Z")


def event_kind(text: str, field: str = "kind") -> str:
    """The event type named by ``text``: a full type (``node.revoked``) or
    its short name (``revoked``).

    Raises:
        FieldError: no such event type.
    """
    kind = text if text.startswith("node.") else f"node.{text}"
    if kind not in EVENT_TYPES:
        names = ", ".join(sorted(t.removeprefix("node.") for t in EVENT_TYPES))
        raise FieldError(
            _STRUCTURE, field, f"is not an event kind ({names}): {text[:64]!r}"
        )
    return kind


def _uuid(text: str, field: str) -> str:
    try:
        return str(uuid_mod.UUID(text))
    except ValueError:
        raise FieldError(_STRUCTURE, field, "is not a UUID") from None


@dataclasses.dataclass(frozen=True)
class EventQuery:
    """One page's worth of filters (see the module docstring).

    Attributes:
        since: only events at or after this time (seconds), or None.
        until: only events before this time (seconds), or None.
        node: only this node's events (canonical UUID), or None.
        kind: only events of this type, or None.
        reason: only events with this reason, or None.
        limit: at most this many events in the page.
        marker: the page starts after this event id, or None.

    Raises:
        FieldError: naming the parameter out of its range or form.
    """

    since: float | None = None
    until: float | None = None
    node: str | None = None
    kind: str | None = None
    reason: str | None = None
    limit: int = DEFAULT_LIMIT
    marker: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.limit, bool) or not 1 <= self.limit <= MAX_LIMIT:
            raise FieldError(_STRUCTURE, "limit", f"must be from 1 to {MAX_LIMIT}")
        if (
            self.since is not None
            and self.until is not None
            and self.since > self.until
        ):
            raise FieldError(_STRUCTURE, "since", "is after until")
        if self.node is not None:
            object.__setattr__(self, "node", _uuid(self.node, "node"))
        if self.marker is not None:
            object.__setattr__(self, "marker", _uuid(self.marker, "marker"))
        if self.kind is not None:
            object.__setattr__(self, "kind", event_kind(self.kind))
        if self.reason is not None and not _REASON.match(self.reason):
            raise FieldError(
                _STRUCTURE, "reason", "must be 1 to 64 of A-Z a-z 0-9 _ . : -"
            )

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> EventQuery:
        """Parse a request's query parameters (each at most once).

        Raises:
            FieldError: an unknown or repeated parameter, or a bad value.
        """
        for name in query:
            if name not in PARAMETERS:
                raise FieldError(_STRUCTURE, name[:64], "is not a parameter")
        getall = getattr(query, "getall", None)
        if getall is not None:
            for name in set(query):
                if len(getall(name)) > 1:
                    raise FieldError(_STRUCTURE, name, "is given more than once")
        limit = query.get("limit")
        if limit is not None and not _LIMIT.match(limit):
            raise FieldError(_STRUCTURE, "limit", f"must be from 1 to {MAX_LIMIT}")
        since, until = query.get("since"), query.get("until")
        return cls(
            since=None if since is None else parse_time(since, "since"),
            until=None if until is None else parse_time(until, "until"),
            node=query.get("node") or None,
            kind=query.get("kind"),
            reason=query.get("reason"),
            limit=DEFAULT_LIMIT if limit is None else int(limit),
            marker=query.get("marker"),
        )

    def to_query(self) -> dict[str, str]:
        """The query parameters that ask for this page."""
        values = {
            "since": None if self.since is None else format_time(self.since),
            "until": None if self.until is None else format_time(self.until),
            "node": self.node,
            "kind": self.kind,
            "reason": self.reason,
            "limit": str(self.limit),
            "marker": self.marker,
        }
        return {k: v for k, v in values.items() if v is not None}

    def after(self, marker: str) -> EventQuery:
        """The query of the page after the event ``marker``."""
        return dataclasses.replace(self, marker=marker)

    def matches(self, kind: str, reason: str) -> bool:
        """Whether an event of type ``kind`` with ``reason`` passes the
        kind and reason filters (the others are applied in the store)."""
        return (self.kind is None or kind == self.kind) and (
            self.reason is None or reason == self.reason
        )
