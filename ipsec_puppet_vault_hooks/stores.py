"""State of the event consumer: processed event ids and dead letters.

Both stores keep their state in memory and, when given a path, also in a
JSON-lines file, so a restarted consumer still knows which events it has
processed and which actions gave up.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

from ipsec_puppet_vault_hooks import _jsonl
from ipsec_puppet_vault_hooks.exceptions import HooksError

__all__ = ["DeadLetter", "DeadLetterStore", "DedupStore"]


def _read(path: str, what: str) -> list[_jsonl.Record]:
    try:
        return _jsonl.read(path)
    except OSError as exc:
        raise HooksError(f"cannot read {what} file {path}: {exc}") from exc


def _append(path: str, what: str, record: Mapping[str, Any]) -> None:
    try:
        _jsonl.append(path, record)
    except (OSError, TypeError, ValueError) as exc:
        raise HooksError(f"cannot write {what} file {path}: {exc}") from exc


class DedupStore:
    """The ids of the events already processed.

    Args:
        path: JSON-lines file (one ``{"event_id": ...}`` per line) that is
            loaded now and appended to by :meth:`add`; ``None`` keeps the
            ids in memory only.

    Raises:
        HooksError: if the file exists but cannot be read.
    """

    def __init__(self, path: str | None = None) -> None:
        self.path = path
        self._seen: set[str] = set()
        if path is not None:
            self._seen.update(
                str(r["event_id"])
                for r in _read(path, "processed-events")
                if "event_id" in r
            )

    def __contains__(self, event_id: object) -> bool:
        return event_id in self._seen

    def __len__(self) -> int:
        return len(self._seen)

    def add(self, event_id: str) -> None:
        """Remember that ``event_id`` was processed.

        Raises:
            HooksError: if the file cannot be written.
        """
        if event_id in self._seen:
            return
        if self.path is not None:
            _append(self.path, "processed-events", {"event_id": event_id})
        self._seen.add(event_id)


@dataclasses.dataclass(frozen=True)
class DeadLetter:
    """An action that gave up on an event.

    Attributes:
        event: the event, as a dict of its fields.
        action: name of the action.
        error: the last error message.
        attempts: how many times the action was tried.
    """

    event: dict[str, Any]
    action: str
    error: str
    attempts: int

    @property
    def event_id(self) -> str:
        return str(self.event.get("id"))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DeadLetter:
        return cls(
            event=dict(data.get("event") or {}),
            action=str(data.get("action")),
            error=str(data.get("error")),
            attempts=int(data.get("attempts") or 0),
        )


class DeadLetterStore:
    """Dead letters, for an operator to inspect and replay.

    Args:
        path: JSON-lines file loaded now and appended to by :meth:`add`;
            ``None`` keeps the records in memory only.

    Raises:
        HooksError: if the file exists but cannot be read.
    """

    def __init__(self, path: str | None = None) -> None:
        self.path = path
        self._records: list[DeadLetter] = []
        if path is not None:
            try:
                self._records.extend(
                    DeadLetter.from_dict(r) for r in _read(path, "dead-letter")
                )
            except (TypeError, ValueError) as exc:
                raise HooksError(f"bad record in dead-letter file {path}: {exc}")

    def __iter__(self) -> Iterator[DeadLetter]:
        return iter(list(self._records))

    def __len__(self) -> int:
        return len(self._records)

    def add(self, record: DeadLetter) -> None:
        """Store ``record``.

        Raises:
            HooksError: if the file cannot be written.
        """
        if self.path is not None:
            _append(self.path, "dead-letter", record.to_dict())
        self._records.append(record)
