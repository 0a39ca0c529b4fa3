"""Fuzz targets of the attestation log's core (issue 30 item 2): a log
entry's leaf data, a history proof's JSON checked against a checkpoint, and
a signed checkpoint note opened with the log's key."""

from __future__ import annotations

import functools
import json
import uuid

from cryptography.hazmat.primitives.asymmetric import ed25519

from trusted_testing.fuzz_common import Target
from trusted_testing.fuzz_common import load_json as _json
from verifier.protocol import translog

__all__ = ["translog_targets"]

_NODE = str(uuid.UUID(int=0x3F2A))


@functools.lru_cache(maxsize=1)
def _log() -> tuple[ed25519.Ed25519PrivateKey, translog.Checkpoint, list[bytes]]:
    """A key, a checkpoint of a 7-entry log and its entries' history JSON."""
    key = ed25519.Ed25519PrivateKey.from_private_bytes(b"\x11" * 32)
    nodes: dict[tuple[int, int], bytes] = {}
    frontier = translog.Frontier()
    entries = []
    for i in range(7):
        entry = translog.LogEntry(
            index=i,
            prev=i - 1 if i else None,
            node_uuid=_NODE,
            project_id="p",
            kind=list(translog.EntryKind)[i % 7],
            reason="r",
            detail="d\u00e9",
            created_at=1.5 + i,
            event_id=None if i % 2 else str(uuid.UUID(int=i)),
        )
        entries.append(entry)
        for level, index, digest in frontier.append(entry.leaf()):
            nodes[(level, index)] = digest
    origin = translog.log_origin(key.public_key())
    cp = translog.Checkpoint(origin, frontier.size, frontier.root())

    def get(level: int, index: int) -> bytes:
        return nodes[(level, index)]

    items = [
        translog.HistoryProof(e, tuple(translog.inclusion_proof(e.index, 7, get)))
        for e in entries
    ]
    return key, cp, [json.dumps([i.to_dict() for i in items]).encode()]


def _log_entry(data: bytes) -> object:
    return translog.LogEntry.from_bytes(data)


def _entry_seeds() -> list[bytes]:
    return [
        translog.LogEntry.from_dict(item["entry"]).to_bytes()
        for item in json.loads(_log()[2][0])
    ]


def _history(data: bytes) -> object:
    _, cp, _ = _log()
    value = _json(data)
    if not isinstance(value, list):
        return None
    items = [translog.HistoryProof.from_dict(item) for item in value]
    return translog.verify_history(_NODE, items, cp, last=6)


def _checkpoint_note(data: bytes) -> object:
    key, _, _ = _log()
    name = translog.log_origin(key.public_key())
    return translog.open_checkpoint(data, key.public_key(), name, name)


def _note_seeds() -> list[bytes]:
    key, cp, _ = _log()
    name = translog.log_origin(key.public_key())
    return [translog.sign_checkpoint(cp, key, name).encode()]


def translog_targets() -> list[Target]:
    """The targets of this module."""
    return [
        Target("log_entry", _log_entry, _entry_seeds),
        Target("log_history", _history, lambda: _log()[2]),
        Target("checkpoint_note", _checkpoint_note, _note_seeds),
    ]
