"""Checking a node's attestation log history, online or offline.

What the tenant keeps (``trusted-tenant history --output FILE``) is the
verifier's history answer (``GET /v1/nodes/{uuid}/history``: entries,
their inclusion proofs and the signed checkpoint they are against) and,
when it kept an older checkpoint, the consistency proof from that
checkpoint's size to the answer's. :func:`verify_saved` checks it with
nothing but the verifier's event key (PEM): the checkpoint's signature
(C2SP signed note, named by :func:`~verifier.protocol.translog.log_origin`),
every entry's inclusion in its tree (RFC 9162), the node's chain of
entries, and that the tree extends the kept one (no history rewritten
since the tenant kept it). The checks are the pure core's
(:mod:`verifier.protocol.translog`).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime
import json
import re
from collections.abc import Mapping
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from nova_plugin.exceptions import TenantError, UsageError
from verifier.protocol import MalformedError, translog

__all__ = [
    "HistoryRefusedError",
    "VerifiedHistory",
    "read_key",
    "seconds",
    "since_time",
    "verify_saved",
]

_RELATIVE = re.compile(r"^(\d{1,9})([smhdw])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


class HistoryRefusedError(TenantError):
    """A history, proof or checkpoint did not verify (exit status 1).

    Attributes:
        reason: the core's stable code (``root_mismatch``, ``forked``...).
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"refused ({reason}): {message}")
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class VerifiedHistory:
    """A history that verified.

    Attributes:
        node_uuid: the node.
        entries: its entries, by leaf index.
        tree_size: the size of the signed tree they are included in.
        kept_size: the size of the tenant's kept checkpoint the tree
            extends (None: none given).
        complete_from: every entry of the node from this leaf index on.
    """

    node_uuid: str
    entries: tuple[translog.LogEntry, ...]
    tree_size: int
    kept_size: int | None
    complete_from: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "node_uuid": self.node_uuid,
            "entries": [json.loads(e.to_bytes()) for e in self.entries],
            "tree_size": self.tree_size,
            "kept_size": self.kept_size,
            "complete_from": self.complete_from,
        }


def seconds(iso: str) -> float:
    """An ISO 8601 UTC time of :func:`since_time` as seconds."""
    return datetime.datetime.fromisoformat(iso).timestamp()


def since_time(text: str, now: float) -> str:
    """``--since``: ``30m``, ``1h``, ``2d`` (ago) or an ISO 8601 time, as
    the ISO 8601 UTC time the API takes.

    Raises:
        UsageError: neither.
    """
    match = _RELATIVE.match(text)
    if match:
        when = now - int(match.group(1)) * _UNITS[match.group(2)]
        stamp = datetime.datetime.fromtimestamp(when, datetime.UTC)
    else:
        try:
            stamp = datetime.datetime.fromisoformat(text)
        except ValueError:
            raise UsageError(
                f"--since {text!r}: give a duration (30m, 1h, 2d) or an ISO 8601 time"
            ) from None
        if stamp.tzinfo is None:
            stamp = stamp.replace(tzinfo=datetime.UTC)
    return stamp.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def read_key(pem: bytes, where: str) -> ed25519.Ed25519PublicKey:
    """The verifier's event key from PEM.

    Raises:
        UsageError: not an Ed25519 public key (naming ``where``).
    """
    try:
        key = serialization.load_pem_public_key(pem)
    except (ValueError, TypeError):
        raise UsageError(f"{where}: not a PEM public key") from None
    if not isinstance(key, ed25519.Ed25519PublicKey):
        raise UsageError(f"{where}: not an Ed25519 key (the verifier's event key)")
    return key


def open_note(note: str, key: ed25519.Ed25519PublicKey) -> translog.Checkpoint:
    """A checkpoint note signed by ``key`` under its log's name.

    Raises:
        HistoryRefusedError: not signed by it, or another log's.
    """
    name = translog.log_origin(key)
    try:
        return translog.open_checkpoint(note, key, name, origin=name)
    except translog.LogProofError as exc:
        raise HistoryRefusedError(exc.reason, str(exc)) from None
    except MalformedError as exc:
        raise HistoryRefusedError("malformed", str(exc)) from None


def verify_saved(
    saved: Mapping[str, Any],
    key: ed25519.Ed25519PublicKey,
    kept_note: str | None = None,
) -> VerifiedHistory:
    """Check a kept history (see the module docstring).

    Args:
        saved: {"history": the API's answer, "consistency": the proof
            from the kept checkpoint's size or None, "since": the time it
            was asked from (seconds) or None, "until": whether it was cut
            at a time}.
        key: the verifier's event key.
        kept_note: the checkpoint the tenant kept earlier, if any.

    Raises:
        UsageError: ``saved`` is not such a document.
        HistoryRefusedError: it does not verify (naming why).
    """
    try:
        history = saved["history"]
        uuid = str(history["node_uuid"])
        size, last = history["tree_size"], history["last"]
        complete_from = history["complete_from"]
        items = [translog.HistoryProof.from_dict(x) for x in history["entries"]]
        note = str(history["checkpoint"])
        if not isinstance(size, int) or not isinstance(complete_from, int):
            raise TypeError("tree_size and complete_from must be integers")
    except (KeyError, TypeError, MalformedError) as exc:
        raise UsageError(f"not a saved history: {exc}") from None
    checkpoint = open_note(note, key)
    if checkpoint.size != size:
        raise HistoryRefusedError(
            "tree_size",
            f"the answer says size {size}, its checkpoint {checkpoint.size}",
        )
    try:
        entries = translog.verify_history(
            uuid,
            items,
            checkpoint,
            complete_from=complete_from or None,
            last=None if saved.get("until") else last,
            since=_since(saved),
        )
    except translog.LogProofError as exc:
        raise HistoryRefusedError(exc.reason, str(exc)) from None
    kept_size = None
    if kept_note is not None:
        kept = open_note(kept_note, key)
        _check_extension(kept, checkpoint, saved.get("consistency"))
        kept_size = kept.size
    return VerifiedHistory(uuid, tuple(entries), size, kept_size, complete_from)


def _since(saved: Mapping[str, Any]) -> float | None:
    """The time the history was asked from (seconds), if it was."""
    since = saved.get("since")
    if since is None:
        return None
    if isinstance(since, bool) or not isinstance(since, (int, float)):
        raise UsageError("not a saved history: since must be a number")
    return float(since)


def _check_extension(
    kept: translog.Checkpoint, new: translog.Checkpoint, consistency: Any
) -> None:
    """``new``'s tree extends ``kept``'s, by the saved proof."""
    if not isinstance(consistency, Mapping):
        raise UsageError(
            "the saved history holds no consistency proof: fetch it with "
            "--checkpoint KEPT.note"
        )
    if consistency.get("from") != kept.size or consistency.get("to") != new.size:
        raise HistoryRefusedError(
            "bad_proof",
            f"the consistency proof is from {consistency.get('from')} to "
            f"{consistency.get('to')}, not from {kept.size} to {new.size}",
        )
    try:
        proof = [_b64(item) for item in consistency.get("proof", [])]
        translog.verify_extension(kept, new, proof)
    except translog.LogProofError as exc:
        raise HistoryRefusedError(exc.reason, str(exc)) from None
    except MalformedError as exc:
        raise HistoryRefusedError("malformed", str(exc)) from None


def _b64(item: Any) -> bytes:
    if not isinstance(item, str):
        raise MalformedError("proof", "a proof item is not a base64 string")
    try:
        return base64.b64decode(item, validate=True)
    except binascii.Error:
        raise MalformedError("proof", "a proof item is not base64") from None
