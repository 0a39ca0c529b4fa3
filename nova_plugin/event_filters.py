"""The options of the event listing, shared by ``trusted-tenant events``
and ``openstack attestation event list`` (issue 30 item 3: events you can
query; the API's query is
:class:`~verifier.protocol.messages.event_query.EventQuery`).

``--since`` and ``--until`` take an ISO 8601 time with a time zone
(``2026-11-27T20:00:00Z``) or a time relative to now (``90s``, ``30m``,
``1h``, ``2d``, ``1w``: that long ago), which the command converts to an
ISO 8601 UTC time before it asks: the API takes absolute times only. Bad
input is a :class:`~nova_plugin.exceptions.UsageError` naming the option.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from nova_plugin.exceptions import UsageError
from verifier.protocol.errors import FieldError
from verifier.protocol.events import EVENT_TYPES
from verifier.protocol.messages.event_query import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    EventQuery,
    parse_time,
)

__all__ = [
    "add_event_options",
    "event_query",
    "event_row",
    "next_params",
    "relative_time",
]

_RELATIVE = re.compile(r"^([0-9]{1,7})([smhdw])$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_KINDS = ", ".join(sorted(t.removeprefix("node.") for t in EVENT_TYPES))
#: The columns of the table, in order.
COLUMNS = ("created_at", "node_uuid", "kind", "reason", "detail", "delivered")


def relative_time(text: str, now: float, option: str) -> float:
    """Seconds since the epoch of ``text``: ISO 8601 with a time zone, or
    a duration ago (``30m``, ``1h``, ``2d``).

    Raises:
        UsageError: neither (``option`` named).
    """
    found = _RELATIVE.match(text)
    if found:
        return now - int(found.group(1)) * _UNIT[found.group(2)]
    try:
        return parse_time(text, option)
    except FieldError:
        raise UsageError(
            f"{option}: {text[:64]!r} is neither an ISO 8601 time with a time "
            "zone (2026-11-27T20:00:00Z) nor a duration ago (30m, 1h, 2d)"
        ) from None


def add_event_options(parser: argparse.ArgumentParser) -> None:
    """The filters and the page options."""
    parser.add_argument("--node", metavar="UUID", help="only this node's events")
    parser.add_argument(
        "--since",
        metavar="TIME",
        help="only events at or after TIME: ISO 8601 with a time zone "
        "(2026-11-27T20:00:00Z) or a duration ago (30m, 1h, 2d)",
    )
    parser.add_argument(
        "--until", metavar="TIME", help="only events before TIME (as --since)"
    )
    parser.add_argument("--kind", metavar="KIND", help=f"only this kind: {_KINDS}")
    parser.add_argument("--reason", help="only events with this reason code")
    parser.add_argument(
        "--limit",
        metavar="N",
        help=f"at most N events a page (1 to {MAX_LIMIT}; default {DEFAULT_LIMIT})",
    )
    parser.add_argument(
        "--all", action="store_true", help="every page, not only the newest"
    )


def event_query(args: argparse.Namespace, now: float) -> EventQuery:
    """The query of the options in ``args``.

    Raises:
        UsageError: a bad option, named.
    """
    since, until = args.since, args.until
    limit = DEFAULT_LIMIT if args.limit is None else args.limit
    if isinstance(limit, str):
        if not limit.isdigit() or len(limit) > 7:
            raise UsageError(f"--limit: must be from 1 to {MAX_LIMIT}")
        limit = int(limit)
    try:
        return EventQuery(
            since=None if since is None else relative_time(since, now, "--since"),
            until=None if until is None else relative_time(until, now, "--until"),
            node=args.node,
            kind=args.kind,
            reason=args.reason,
            limit=limit,
        )
    except FieldError as exc:
        raise UsageError(f"--{exc.field}: {exc.detail.split(' ', 1)[1]}") from None


def next_params(links: Sequence[Mapping[str, Any]]) -> dict[str, str] | None:
    """The query parameters of the ``next`` link, or None (no more)."""
    for link in links:
        if link.get("rel") == "next" and isinstance(link.get("href"), str):
            return dict(parse_qsl(urlsplit(link["href"]).query))
    return None


def event_row(entry: Mapping[str, Any]) -> dict[str, Any]:
    """A listed event's columns (``kind``: the type without ``node.``:
    ``unreachable`` stays unreachable, ``recovered`` recovered)."""
    event = entry.get("signed_event", {}).get("event", {})
    kind = str(entry.get("type") or event.get("type") or "node.revoked")
    return {
        "created_at": entry.get("created_at") or event.get("created_at"),
        "node_uuid": entry.get("node_uuid") or event.get("node_uuid"),
        "kind": kind.removeprefix("node."),
        "reason": entry.get("reason", event.get("reason")),
        "detail": entry.get("detail", event.get("detail")),
        "delivered": entry.get("delivered"),
        "id": entry.get("id") or event.get("id"),
    }
