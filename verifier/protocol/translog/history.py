"""A node's history in the attestation log, checked offline by a tenant.

Every change of the verifier's word on a node is one :class:`LogEntry`,
the leaf data of the log's RFC 9162 tree (its canonical JSON). Entries of
one node are chained: ``prev`` names the leaf index of the node's previous
entry (None for its first). Given a checkpoint it trusts and, for each
entry, an inclusion proof in that checkpoint's tree, a tenant checks with
:func:`verify_history` that:

* every entry is in the signed tree (a rewritten entry, or a proof for
  another tree, fails: ``root_mismatch``);
* every entry is of the node asked for (``wrong_node``);
* the entries are in log order without repeats (``out_of_order``);
* none is missing between the first and the last: each ``prev`` is the
  index of the entry before it (``missing_entry``), and the first has no
  ``prev`` -- or, for a history kept or asked from leaf ``complete_from``
  on, a ``prev`` below ``complete_from``; or, for a history asked from a
  time ``since`` on, the first is stamped before ``since`` (the anchor:
  the node's last entry before the window).

What the tree cannot prove is absence: nothing in the entries says which is
the node's *last*. ``last`` (the index the log says is the node's last at
that tree size) catches an answer cut at the end; a log that lies about
``last`` too can hide the newest entries, but only until the node's next
entry is shown, whose ``prev`` then names the hidden one.

:func:`verify_extension` checks that a newer checkpoint's tree extends the
one the tenant kept (a consistency proof): a log that rewrote history
cannot give one (``forked``).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import enum
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from verifier.protocol.envelope import canonical_uuid
from verifier.protocol.errors import MalformedError
from verifier.protocol.translog.checkpoint import Checkpoint
from verifier.protocol.translog.tree import (
    HASH_SIZE,
    MAX_SIZE,
    LogProofError,
    leaf_hash,
    verify_consistency,
    verify_inclusion,
)

__all__ = [
    "MAX_DETAIL",
    "MAX_ENTRY_BYTES",
    "MAX_TEXT",
    "EntryKind",
    "HistoryProof",
    "LogEntry",
    "verify_extension",
    "verify_history",
]

#: Longest ``project_id`` and ``reason`` (characters).
MAX_TEXT = 255
#: Longest ``detail`` (characters); a longer one is cut by whoever appends.
MAX_DETAIL = 8192
#: Largest encoded entry accepted by :meth:`LogEntry.from_bytes`.
MAX_ENTRY_BYTES = 64 * 1024
#: Most hashes in one inclusion proof (a tree of 2**63 leaves needs 63).
_MAX_PROOF = 64
_UUID = re.compile("[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_SURROGATE = re.compile("[\ud800-\udfff]")
_FIELDS = frozenset(
    {
        "index",
        "prev",
        "node_uuid",
        "project_id",
        "kind",
        "reason",
        "detail",
        "created_at",
        "event_id",
    }
)


class EntryKind(enum.Enum):
    """What changed in the verifier's word on a node."""

    ATTESTED = "attested"
    REVOKED = "revoked"
    FAILED = "failed"
    UNREACHABLE = "unreachable"
    RECOVERED = "recovered"
    POLICY_CHANGED = "policy_changed"
    HOST_UNTRUSTED = "host_untrusted"


def _bad(detail: str) -> MalformedError:
    return MalformedError("log entry", detail)


def _index(value: object, name: str) -> int:
    if type(value) is not int or not 0 <= value < MAX_SIZE:
        raise _bad(f"{name} must be an integer in 0..{MAX_SIZE - 1}")
    return value


def _text(value: object, name: str, limit: int) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise _bad(f"{name} must be a string of at most {limit} characters")
    if _SURROGATE.search(value):
        raise _bad(f"{name} is not Unicode text (a lone surrogate)")
    return value


def _bound(value: object, name: str) -> int | None:
    if value is not None and (type(value) is not int or value < 0):
        raise MalformedError("history", f"{name} must be None or an index")
    return value


@dataclasses.dataclass(frozen=True)
class LogEntry:
    """One change of the verifier's word on a node; a leaf of the log.

    Attributes:
        index: the entry's leaf index.
        prev: the leaf index of the node's previous entry (None: its first).
        node_uuid: the node (canonical lower-case UUID).
        project_id: the node's project.
        kind: what changed.
        reason: machine-readable code (e.g. ``pcr_policy``).
        detail: human-readable explanation (at most :data:`MAX_DETAIL`).
        created_at: seconds since the epoch, as the verifier stamped it.
        event_id: the signed event's id when the change carried one.

    Raises:
        MalformedError: a field of the wrong type, size or form.
    """

    index: int
    prev: int | None
    node_uuid: str
    project_id: str
    kind: EntryKind
    reason: str
    detail: str
    created_at: float
    event_id: str | None = None

    def __post_init__(self) -> None:
        _index(self.index, "index")
        if self.prev is not None and _index(self.prev, "prev") >= self.index:
            raise _bad("prev must be below index")
        if not isinstance(self.node_uuid, str) or not _UUID.fullmatch(self.node_uuid):
            raise _bad("node_uuid must be a canonical lower-case UUID")
        _text(self.project_id, "project_id", MAX_TEXT)
        if not isinstance(self.kind, EntryKind):
            raise _bad("kind must be an EntryKind")
        _text(self.reason, "reason", MAX_TEXT)
        _text(self.detail, "detail", MAX_DETAIL)
        at = self.created_at
        if isinstance(at, bool) or not isinstance(at, (int, float)):
            raise _bad("created_at must be a number")
        if not math.isfinite(at) or not 0 <= at < 2**53:
            raise _bad("created_at must be finite and not negative")
        object.__setattr__(self, "created_at", float(at))
        if self.event_id is not None and (
            not isinstance(self.event_id, str) or not _UUID.fullmatch(self.event_id)
        ):
            raise _bad("event_id must be null or a canonical lower-case UUID")

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of the entry (what :meth:`to_bytes` encodes)."""
        return {
            "index": self.index,
            "prev": self.prev,
            "node_uuid": self.node_uuid,
            "project_id": self.project_id,
            "kind": self.kind.value,
            "reason": self.reason,
            "detail": self.detail,
            "created_at": self.created_at,
            "event_id": self.event_id,
        }

    def to_bytes(self) -> bytes:
        """Canonical JSON: sorted keys, no whitespace, ASCII (so UTF-8)."""
        return json.dumps(
            self.to_dict(), sort_keys=True, separators=(",", ":"), allow_nan=False
        ).encode()

    def leaf(self) -> bytes:
        """The entry's leaf hash, ``leaf_hash(to_bytes())``."""
        return leaf_hash(self.to_bytes())

    @classmethod
    def from_dict(cls, data: object) -> LogEntry:
        """Parse :meth:`to_dict`'s form, validating every field.

        Raises:
            MalformedError: naming what is wrong.
        """
        if not isinstance(data, Mapping) or set(data) != _FIELDS:
            raise _bad(f"fields must be {sorted(_FIELDS)}")
        kind = data["kind"]
        try:
            parsed = EntryKind(kind) if isinstance(kind, str) else None
        except ValueError:
            parsed = None
        if parsed is None:
            raise _bad(f"kind must be one of {[k.value for k in EntryKind]}")
        return cls(
            index=data["index"],
            prev=data["prev"],
            node_uuid=data["node_uuid"],
            project_id=data["project_id"],
            kind=parsed,
            reason=data["reason"],
            detail=data["detail"],
            created_at=data["created_at"],
            event_id=data["event_id"],
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> LogEntry:
        """Parse leaf data; it must be the canonical encoding.

        Raises:
            MalformedError: not JSON, not an entry, or not canonical.
        """
        if not isinstance(data, bytes) or len(data) > MAX_ENTRY_BYTES:
            raise _bad(f"must be at most {MAX_ENTRY_BYTES} bytes")
        try:
            value = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise _bad("not UTF-8 JSON") from None
        entry = cls.from_dict(value)
        if entry.to_bytes() != data:
            raise _bad("not in canonical form")
        return entry


@dataclasses.dataclass(frozen=True)
class HistoryProof:
    """An entry and its inclusion proof in a checkpoint's tree.

    Wire form: ``{"entry": {...}, "proof": ["<base64>", ...]}``.
    """

    entry: LogEntry
    proof: tuple[bytes, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.entry, LogEntry):
            raise MalformedError("history proof", "entry must be a LogEntry")
        if isinstance(self.proof, (bytes, str)) or not isinstance(self.proof, Sequence):
            raise MalformedError("history proof", "proof must be a sequence")
        proof = tuple(self.proof)
        if len(proof) > _MAX_PROOF or not all(
            isinstance(h, bytes) and len(h) == HASH_SIZE for h in proof
        ):
            raise MalformedError("history proof", "proof must be 32-byte hashes")
        object.__setattr__(self, "proof", proof)

    def to_dict(self) -> dict[str, Any]:
        return {
            "entry": self.entry.to_dict(),
            "proof": [base64.b64encode(h).decode() for h in self.proof],
        }

    @classmethod
    def from_dict(cls, data: object) -> HistoryProof:
        """Parse the wire form (verifies nothing: see :func:`verify_history`).

        Raises:
            MalformedError: naming what is wrong.
        """
        if not isinstance(data, Mapping) or set(data) != {"entry", "proof"}:
            raise MalformedError("history proof", "fields must be entry, proof")
        texts = data["proof"]
        if not isinstance(texts, list) or len(texts) > _MAX_PROOF:
            raise MalformedError("history proof", "proof must be a list of hashes")
        proof = []
        for text in texts:
            try:
                digest = base64.b64decode(text, validate=True)
            except (binascii.Error, ValueError, TypeError):
                raise MalformedError("history proof", "a hash is not base64") from None
            if len(digest) != HASH_SIZE:
                raise MalformedError("history proof", "a hash is not 32 bytes")
            proof.append(digest)
        return cls(LogEntry.from_dict(data["entry"]), tuple(proof))


def _check_chain(
    items: Sequence[HistoryProof], complete_from: int | None, since: float | None
) -> None:
    first = items[0].entry
    bound = -1 if complete_from is None else complete_from
    anchored = since is not None and first.created_at < since
    if first.prev is not None and first.prev >= bound and not anchored:
        raise LogProofError(
            "missing_entry",
            f"entry {first.index} follows entry {first.prev}, which is not given",
        )
    pairs = list(zip(items, items[1:], strict=False))
    for before, item in pairs:
        if item.entry.index <= before.entry.index:
            raise LogProofError(
                "out_of_order",
                f"entry {item.entry.index} comes after entry {before.entry.index}",
            )
    for before, item in pairs:
        entry = item.entry
        if entry.prev != before.entry.index:
            raise LogProofError(
                "missing_entry",
                f"entry {entry.index} follows {entry.prev}, not {before.entry.index}",
            )


def verify_history(
    node_uuid: str,
    items: Sequence[HistoryProof],
    checkpoint: Checkpoint,
    *,
    complete_from: int | None = None,
    last: int | None = None,
    since: float | None = None,
) -> list[LogEntry]:
    """Check a node's history against a checkpoint (module docstring).

    Args:
        node_uuid: the node whose history this must be.
        items: the node's entries, in log order, each with its inclusion
            proof in ``checkpoint``'s tree.
        checkpoint: a checkpoint the caller verified (or kept).
        complete_from: None when the history must start with the node's
            first entry; else the leaf index from which it must be whole
            (pruned by retention, or asked from there on): the first item's
            ``prev`` must then be None or below ``complete_from``.
        last: the node's last leaf index at the checkpoint's size, as the
            log states it; the last item must be that entry (None: not
            checked).
        since: for a history asked from a time on (seconds since the
            epoch): the first item may also be any entry stamped before
            ``since`` (the node's last entry before the window, which the
            log sends as the anchor); the chain from it then covers the
            window. Sound as far as the node's stamps grow along its chain.

    Returns:
        The entries, in log order.

    Raises:
        LogProofError: ``wrong_node``, ``index_out_of_range``,
            ``out_of_order``, ``missing_entry``, ``root_mismatch``,
            ``bad_proof_length``.
        MalformedError: a bad node UUID or argument.
    """
    node = canonical_uuid(node_uuid)
    if not isinstance(checkpoint, Checkpoint):
        raise MalformedError("history", "checkpoint must be a Checkpoint")
    if isinstance(items, (bytes, str)) or not isinstance(items, Sequence):
        raise MalformedError("history", "items must be a sequence")
    if not all(isinstance(item, HistoryProof) for item in items):
        raise MalformedError("history", "items must be HistoryProofs")
    complete_from = _bound(complete_from, "complete_from")
    last = _bound(last, "last")
    if since is not None and (
        isinstance(since, bool)
        or not isinstance(since, (int, float))
        or not math.isfinite(since)
    ):
        raise MalformedError("history", "since must be None or a number")
    for item in items:
        if item.entry.node_uuid != node:
            raise LogProofError(
                "wrong_node", f"entry {item.entry.index} is of another node"
            )
        if item.entry.index >= checkpoint.size:
            raise LogProofError(
                "index_out_of_range",
                f"entry {item.entry.index} is not in the tree of {checkpoint.size}",
            )
    if items:
        _check_chain(items, complete_from, since)
    if last is not None and (not items or items[-1].entry.index != last):
        raise LogProofError(
            "missing_entry", f"the node's last entry {last} is not given"
        )
    for item in items:
        verify_inclusion(
            item.entry.leaf(),
            item.entry.index,
            checkpoint.size,
            item.proof,
            checkpoint.root,
        )
    return [item.entry for item in items]


def verify_extension(kept: Checkpoint, new: Checkpoint, proof: Sequence[bytes]) -> None:
    """Check that ``new``'s tree extends the tree of ``kept``.

    Args:
        kept: a checkpoint the caller verified earlier and kept.
        new: a newer verified checkpoint of the same log.
        proof: the consistency proof from ``kept.size`` to ``new.size``.

    Raises:
        LogProofError: ``wrong_origin`` (another log), ``forked`` (a smaller
            tree, another tree of the same size, or a proof that does not
            lead to both roots: the log rewrote its history),
            ``bad_proof_length``.
        MalformedError: a hash that is not 32 bytes.
    """
    if not isinstance(kept, Checkpoint) or not isinstance(new, Checkpoint):
        raise MalformedError("log extension", "kept and new must be Checkpoints")
    if kept.origin != new.origin:
        raise LogProofError(
            "wrong_origin", f"{new.origin[:100]!r} is not {kept.origin[:100]!r}"
        )
    if new.size < kept.size:
        raise LogProofError(
            "forked", f"the tree shrank from {kept.size} to {new.size} leaves"
        )
    try:
        verify_consistency(kept.size, new.size, kept.root, new.root, proof)
    except LogProofError as exc:
        if exc.reason != "bad_proof":
            raise
        raise LogProofError("forked", exc.detail) from None
