"""Staging an attestation log entry in the caller's transaction.

The entry of a node's state change is one INSERT in the same database
transaction as the change (and its outbox event): committed together or
not at all, and only by the write that made the change (exactly once when
several verifier processes race). The sequencer gives it its leaf index
later (:mod:`verifier.tlog.sequencer`). Nothing is staged for a quote that
changes nothing.
"""

from __future__ import annotations

import dataclasses
from typing import cast

import sqlalchemy as sa
from sqlalchemy.orm import Session

from verifier.db import LogEntryRow

__all__ = [
    "ATTESTED",
    "FAILED",
    "HOST_UNTRUSTED",
    "POLICY_CHANGED",
    "RECOVERED",
    "REVOKED",
    "UNREACHABLE",
    "Staged",
    "log_values",
    "stage",
    "stage_note",
]

# the kinds of entry (the values of verifier.protocol.translog.EntryKind)
ATTESTED = "attested"
REVOKED = "revoked"
FAILED = "failed"
UNREACHABLE = "unreachable"
RECOVERED = "recovered"
POLICY_CHANGED = "policy_changed"
HOST_UNTRUSTED = "host_untrusted"
#: One prepared INSERT (values as parameters; not an ORM flush).
_INSERT = sa.insert(cast(sa.Table, LogEntryRow.__table__))


@dataclasses.dataclass(frozen=True)
class Staged:
    """What a state change writes into the log (its node and project are
    the row's): the kind, its reason and detail, and the signed event's
    id when the change carried one."""

    kind: str
    reason: str
    detail: str = ""
    event_id: str | None = None


def log_values(
    kind: str,
    node_uuid: str,
    project_id: str,
    reason: str,
    detail: str,
    now: float,
    event_id: str | None = None,
) -> dict[str, object]:
    """The staged row of one entry (for many at once: one INSERT of
    several rows in the caller's transaction)."""
    return {
        "node_uuid": node_uuid,
        "project_id": project_id,
        "created_at": now,
        "kind": kind,
        "reason": reason,
        "detail": detail,
        "event_id": event_id,
        "pruned": False,
    }


def stage(
    session: Session,
    kind: str,
    node_uuid: str,
    project_id: str,
    reason: str,
    detail: str,
    now: float,
    event_id: str | None = None,
) -> None:
    """Stage one entry in ``session``'s transaction."""
    values = log_values(kind, node_uuid, project_id, reason, detail, now, event_id)
    # one prepared statement, its values as parameters: no ORM flush, no
    # statement built per entry
    session.execute(_INSERT, [values])


def stage_note(
    session: Session, note: Staged, node_uuid: str, project_id: str, now: float
) -> None:
    """Stage ``note`` about ``node_uuid`` in ``session``'s transaction."""
    stage(
        session,
        note.kind,
        node_uuid,
        project_id,
        note.reason,
        note.detail,
        now,
        note.event_id,
    )
