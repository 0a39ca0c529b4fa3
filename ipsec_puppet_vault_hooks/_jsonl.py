"""Append-only JSON-lines files shared by the state stores and actions.

Each record is one JSON object on one line. Writers hold an exclusive
``flock`` while they read-check-append, so several processes may share a
file. A torn last line (crash mid-write) is skipped on read and a newline is
added before the next record so it cannot corrupt it.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable, Mapping
from typing import Any

from oslo_log import log as logging

LOG = logging.getLogger(__name__)

Record = dict[str, Any]


def _parse(path: str, text: str) -> list[Record]:
    records: list[Record] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not isinstance(record, dict):
            LOG.warning("Skipping unreadable line %d of %s", lineno, path)
            continue
        records.append(record)
    return records


def read(path: str) -> list[Record]:
    """Return every readable record of ``path`` (``[]`` if it is missing).

    Raises:
        OSError: if the file exists but cannot be read.
    """
    try:
        with open(path, encoding="utf-8") as f:
            fcntl.flock(f, fcntl.LOCK_SH)
            return _parse(path, f.read())
    except FileNotFoundError:
        return []


def append(
    path: str,
    record: Mapping[str, Any],
    unless: Callable[[Record], bool] | None = None,
) -> bool:
    """Append ``record`` to ``path`` and fsync it.

    Args:
        path: the file; created if missing.
        record: a JSON-serialisable mapping.
        unless: if given and true for any existing record, nothing is
            written (checked under the same lock as the write).

    Returns:
        True if the record was written.

    Raises:
        OSError: on any I/O failure.
        TypeError: if ``record`` is not JSON-serialisable.
    """
    line = json.dumps(dict(record), sort_keys=True) + "\n"
    with open(path, "a+", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        text = f.read()
        if unless is not None and any(unless(r) for r in _parse(path, text)):
            return False
        if text and not text.endswith("\n"):
            line = "\n" + line
        f.write(line)
        f.flush()
        os.fsync(f.fileno())
    return True
