"""Batched deep quote: guest quotes bound to one host quote over a Merkle root.

A deep quote (:mod:`verifier.protocol.deepquote`) costs one host TPM quote
per guest check. Batching makes it one host quote per host interval,
whatever the number of guests (issue 29, item 5; after Excalibur's batched
monitor attestations):

1. each time a guest's quote passes, the verifier adds the leaf
   :func:`guest_leaf` ``(instance UUID, the guest quote's TPMS_ATTEST)`` to
   the pending batch of the guest's current host;
2. at the host's next round it builds a :class:`GuestBatch`, an RFC 9162
   section 2.1 Merkle tree over those leaves (hashing and inclusion proofs
   are :mod:`verifier.protocol.translog.tree`'s), and asks the host agent
   for an ordinary quote with the 32-byte nonce :func:`host_nonce`
   ``(fresh nonce, root, size)``: the host quote's extraData is
   ``bind_nonce(host_nonce(...))`` like any quote's;
3. the verifier judges the host quote and records the round as a
   :class:`HostRound`; a guest in the batch is then "quoted while its host
   was in this attested state", checked by :func:`verify_guest_in_batch`
   with the guest's :class:`BatchProof`.

Byte layouts (``u16``/``u64`` big-endian)::

    guest_leaf = "trusted-cloud batch leaf v1" 0x00 || uuid (16 bytes)
                 || SHA-256(guest TPMS_ATTEST)                  (76 bytes)
    host_nonce = SHA-256("trusted-cloud batch root v1" 0x00
                         || u16 len(fresh) || fresh || root (32) || u64 size)
    extraData  = bind_nonce(host_nonce)        (verifier.protocol.quote)

Pure: no I/O, and no clock but the ``now`` the caller passes.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import enum
import hashlib
import hmac
import math
import uuid as uuid_mod
from collections.abc import Mapping, Sequence
from typing import Any

from verifier.protocol import _marshal as m
from verifier.protocol.errors import EvidenceError, MalformedError
from verifier.protocol.quote import bind_nonce
from verifier.protocol.tpm import TpmAttest
from verifier.protocol.translog.tree import (
    EMPTY_ROOT,
    HASH_SIZE,
    MAX_SIZE,
    Frontier,
    LogProofError,
    inclusion_proof,
    leaf_hash,
    verify_inclusion,
)

__all__ = [
    "LEAF_LABEL",
    "LEAF_SIZE",
    "MAX_NONCE",
    "MIN_NONCE",
    "NONCE_LABEL",
    "BatchError",
    "BatchProof",
    "BatchReason",
    "GuestBatch",
    "HostRound",
    "guest_leaf",
    "host_nonce",
    "verify_guest_in_batch",
]

#: Domain label of a batch leaf.
LEAF_LABEL = b"trusted-cloud batch leaf v1\x00"
#: Domain label of a host nonce.
NONCE_LABEL = b"trusted-cloud batch root v1\x00"
#: Size of every leaf: label, UUID, SHA-256 of the guest's TPMS_ATTEST.
LEAF_SIZE = len(LEAF_LABEL) + 16 + HASH_SIZE
#: Bounds of the verifier's fresh nonce in a host round.
MIN_NONCE, MAX_NONCE = 16, 64
#: Longest inclusion proof of a tree of at most MAX_SIZE leaves.
_MAX_PATH = 64
#: Largest TPMS_ATTEST accepted (as :class:`verifier.protocol.quote.Quote`).
_MAX_ATTEST = 4096


class BatchReason(enum.StrEnum):
    """Why a guest is refused by :func:`verify_guest_in_batch`."""

    #: the round is another host's
    OTHER_HOST = "batch_other_host"
    #: the inclusion proof does not lead from the guest's leaf to the root
    PROOF = "batch_proof"
    #: the host quote does not carry this round's root, size and nonce
    BINDING = "batch_binding"
    #: the round is older than allowed (or judged after ``now``)
    STALE = "batch_stale"
    #: the host failed its attestation in that round
    HOST_UNTRUSTED = "batch_host_untrusted"


class BatchError(EvidenceError):
    """A guest that is not proven to be in an attested host's batch.

    ``reason`` is a :class:`BatchReason` value.
    """

    def __init__(self, reason: BatchReason, detail: str) -> None:
        super().__init__(reason.value, detail)


def _uuid(value: object, what: str) -> uuid_mod.UUID:
    if not isinstance(value, str):
        raise MalformedError(what, "must be a UUID string")
    try:
        return uuid_mod.UUID(value)
    except ValueError:
        raise MalformedError(what, f"not a UUID: {value[:40]!r}") from None


def _is_count(value: object) -> bool:
    return type(value) is int and 0 <= value <= MAX_SIZE


def _check_hash(value: object, what: str) -> bytes:
    if not isinstance(value, bytes) or len(value) != HASH_SIZE:
        raise MalformedError(what, "must be 32 bytes")
    return value


def _check_nonce(value: object) -> bytes:
    if not isinstance(value, bytes) or not MIN_NONCE <= len(value) <= MAX_NONCE:
        raise MalformedError(
            "host nonce", f"fresh nonce must be {MIN_NONCE}..{MAX_NONCE} bytes"
        )
    return value


def guest_leaf(instance_uuid: str, vtpm_attest: bytes) -> bytes:
    """The leaf data of one passing guest quote.

    Args:
        instance_uuid: the Nova instance UUID (any form :class:`uuid.UUID`
            parses; the leaf holds its 16 bytes).
        vtpm_attest: the TPMS_ATTEST of the guest's (vTPM's) quote.

    Returns:
        :data:`LEAF_SIZE` bytes.

    Raises:
        MalformedError: not a UUID, or the attest is not bytes.
    """
    node = _uuid(instance_uuid, "batch leaf")
    if not isinstance(vtpm_attest, bytes):
        raise MalformedError("batch leaf", "the guest's attest must be bytes")
    return LEAF_LABEL + node.bytes + hashlib.sha256(vtpm_attest).digest()


def host_nonce(fresh_nonce: bytes, root: bytes, size: int) -> bytes:
    """The nonce of a host round: what the host quote's extraData binds.

    Args:
        fresh_nonce: the verifier's fresh nonce for this round.
        root: the batch's Merkle root (:attr:`GuestBatch.root`).
        size: the number of leaves in the batch.

    Returns:
        32 bytes, handed to the host agent as any quote's nonce.

    Raises:
        MalformedError: a nonce out of bounds, a root that is not 32
            bytes, a size out of range.
    """
    fresh = _check_nonce(fresh_nonce)
    digest = _check_hash(root, "host nonce root")
    if not _is_count(size):
        raise MalformedError("host nonce", f"size must be 0..{MAX_SIZE}")
    h = hashlib.sha256(NONCE_LABEL)
    h.update(m.u16(len(fresh)) + fresh + digest + m.u64(size))
    return h.digest()


@dataclasses.dataclass(frozen=True)
class BatchProof:
    """A guest's inclusion proof in its host's batch (RFC 9162 2.1.3).

    Attributes:
        index: the guest's leaf index.
        size: the number of leaves in the batch.
        path: ``PATH(index, D[size])``, leaf side first.
    """

    index: int
    size: int
    path: tuple[bytes, ...]

    def __post_init__(self) -> None:
        if not _is_count(self.size) or not _is_count(self.index):
            raise MalformedError("batch proof", f"index and size must be 0..{MAX_SIZE}")
        if self.index >= self.size:
            raise MalformedError("batch proof", f"leaf {self.index} not in {self.size}")
        if not isinstance(self.path, tuple) or len(self.path) > _MAX_PATH:
            raise MalformedError(
                "batch proof", f"path must be a tuple of <= {_MAX_PATH}"
            )
        for item in self.path:
            _check_hash(item, "batch proof path")

    def to_dict(self) -> dict[str, Any]:
        """``{"index": i, "size": n, "path": [hex, ...]}``."""
        return {
            "index": self.index,
            "size": self.size,
            "path": [h.hex() for h in self.path],
        }

    @classmethod
    def from_dict(cls, data: object) -> BatchProof:
        """Parse :meth:`to_dict`'s form; unknown fields are refused.

        Raises:
            MalformedError: wrong fields, types or lengths.
        """
        if not isinstance(data, Mapping) or set(data) != {"index", "size", "path"}:
            raise MalformedError("batch proof", "fields must be index, size, path")
        texts = data["path"]
        if not isinstance(texts, list) or len(texts) > _MAX_PATH:
            raise MalformedError(
                "batch proof", f"path must be a list of <= {_MAX_PATH}"
            )
        return cls(data["index"], data["size"], tuple(_hex(t, "path") for t in texts))


def _hex(value: object, what: str) -> bytes:
    if not isinstance(value, str) or len(value) != 2 * HASH_SIZE:
        raise MalformedError("batch", f"{what}: 64 hex digits expected")
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise MalformedError("batch", f"{what}: 64 hex digits expected") from None


class GuestBatch:
    """The Merkle tree over a host's pending guest leaves.

    Args:
        leaves: :func:`guest_leaf` values, in the order the guests passed.
            Empty is allowed (a host round with no guest).

    Raises:
        MalformedError: a leaf that is not a :func:`guest_leaf` value.
    """

    __slots__ = ("_nodes", "_root", "_size")

    def __init__(self, leaves: Sequence[bytes]) -> None:
        if isinstance(leaves, (bytes, str)) or not isinstance(leaves, Sequence):
            raise MalformedError("guest batch", "leaves must be a sequence")
        frontier = Frontier()
        nodes: dict[tuple[int, int], bytes] = {}
        for leaf in leaves:
            if (
                not isinstance(leaf, bytes)
                or len(leaf) != LEAF_SIZE
                or not leaf.startswith(LEAF_LABEL)
            ):
                raise MalformedError("guest batch", "every leaf must be a guest_leaf")
            for level, index, digest in frontier.append(leaf_hash(leaf)):
                nodes[(level, index)] = digest
        self._nodes = nodes
        self._size = frontier.size
        self._root = frontier.root()

    @property
    def root(self) -> bytes:
        """RFC 9162 ``MTH`` of the leaves (:data:`EMPTY_ROOT` when empty)."""
        return self._root

    @property
    def size(self) -> int:
        """The number of leaves."""
        return self._size

    def proof(self, index: int) -> BatchProof:
        """The inclusion proof of leaf ``index``.

        Raises:
            MalformedError: ``index`` is not a leaf of this batch.
        """
        if type(index) is not int or not 0 <= index < self._size:
            raise MalformedError("guest batch", f"no leaf {index!r} in {self._size}")
        nodes = self._nodes
        path = inclusion_proof(index, self._size, lambda lv, i: nodes[(lv, i)])
        return BatchProof(index, self._size, tuple(path))


@dataclasses.dataclass(frozen=True)
class HostRound:
    """A judged host round: what a guest's :class:`BatchProof` is checked
    against. The verifier's own record of the host quote it judged.

    Attributes:
        host_uuid: the host's node UUID (its resource provider UUID).
        fresh_nonce: the verifier's fresh nonce for the round.
        root: the batch's root.
        size: the batch's number of leaves.
        attest: the host quote's TPMS_ATTEST bytes.
        at: when the verifier judged it (its clock, in seconds).
        host_attested: the host's verdict in that round.

    Raises:
        MalformedError: a field of the wrong type or size; an attest that
            is not a TPMS_ATTEST of a quote.
    """

    host_uuid: str
    fresh_nonce: bytes
    root: bytes
    size: int
    attest: bytes
    at: float
    host_attested: bool

    def __post_init__(self) -> None:
        _uuid(self.host_uuid, "host round host_uuid")
        _check_nonce(self.fresh_nonce)
        _check_hash(self.root, "host round root")
        if not _is_count(self.size):
            raise MalformedError("host round", f"size must be 0..{MAX_SIZE}")
        if self.size == 0 and self.root != EMPTY_ROOT:
            raise MalformedError("host round", "an empty batch has the empty root")
        if not isinstance(self.attest, bytes) or len(self.attest) > _MAX_ATTEST:
            raise MalformedError("host round", f"attest must be <= {_MAX_ATTEST} bytes")
        TpmAttest.from_bytes(self.attest)
        if not _is_time(self.at):
            raise MalformedError("host round", "at must be a finite number")
        if type(self.host_attested) is not bool:
            raise MalformedError("host round", "host_attested must be a boolean")

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (bytes as hex, the attest as base64)."""
        return {
            "host_uuid": self.host_uuid,
            "fresh_nonce": self.fresh_nonce.hex(),
            "root": self.root.hex(),
            "size": self.size,
            "attest": base64.b64encode(self.attest).decode(),
            "at": self.at,
            "host_attested": self.host_attested,
        }

    @classmethod
    def from_dict(cls, data: object) -> HostRound:
        """Parse :meth:`to_dict`'s form; unknown fields are refused.

        Raises:
            MalformedError: naming the bad field.
        """
        if not isinstance(data, Mapping) or set(data) != _ROUND_FIELDS:
            raise MalformedError(
                "host round", f"fields must be {sorted(_ROUND_FIELDS)}"
            )
        nonce = data["fresh_nonce"]
        if not isinstance(nonce, str) or len(nonce) > 2 * MAX_NONCE:
            raise MalformedError("host round", "fresh_nonce must be hex")
        try:
            fresh = bytes.fromhex(nonce)
        except ValueError:
            raise MalformedError("host round", "fresh_nonce must be hex") from None
        return cls(
            host_uuid=data["host_uuid"],
            fresh_nonce=fresh,
            root=_hex(data["root"], "root"),
            size=data["size"],
            attest=_b64(data["attest"]),
            at=data["at"],
            host_attested=data["host_attested"],
        )


_ROUND_FIELDS = frozenset(
    {"host_uuid", "fresh_nonce", "root", "size", "attest", "at", "host_attested"}
)


def _is_time(value: object) -> bool:
    return type(value) in (int, float) and math.isfinite(value)  # type: ignore[arg-type]


def _b64(value: object) -> bytes:
    if not isinstance(value, str) or len(value) > 2 * _MAX_ATTEST:
        raise MalformedError("host round", "attest must be base64")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise MalformedError("host round", "attest must be base64") from None


def verify_guest_in_batch(
    round: HostRound,  # noqa: A002 -- the interface's name
    *,
    host_uuid: str,
    instance_uuid: str,
    vtpm_attest: bytes,
    proof: BatchProof,
    now: float,
    max_age: float,
) -> None:
    """Check that a guest quote was batched under an attested host quote.

    Checks, in order: the round is this host's; the host quote binds the
    round's nonce, root and size; the host passed in that round; the round
    is at most ``max_age`` old at ``now``; the proof leads from the guest's
    leaf to the round's root.

    Args:
        round: the host round the guest's leaf was batched in.
        host_uuid: the host the verifier believes runs the guest.
        instance_uuid: the guest.
        vtpm_attest: the TPMS_ATTEST of the guest quote that passed.
        proof: the guest's inclusion proof in the round's batch.
        now: the caller's clock (same clock as ``round.at``).
        max_age: how old a round may be, in seconds (> 0).

    Raises:
        BatchError: (an :class:`EvidenceError`) reason ``batch_other_host``,
            ``batch_binding``, ``batch_host_untrusted``, ``batch_stale`` or
            ``batch_proof``.
        MalformedError: arguments of the wrong type or form.
    """
    if not isinstance(round, HostRound) or not isinstance(proof, BatchProof):
        raise MalformedError("batch check", "needs a HostRound and a BatchProof")
    if not _is_time(now) or not _is_time(max_age) or max_age <= 0:
        raise MalformedError(
            "batch check", "now and max_age must be finite, max_age > 0"
        )
    leaf = guest_leaf(instance_uuid, vtpm_attest)
    if _uuid(host_uuid, "batch check host_uuid") != uuid_mod.UUID(round.host_uuid):
        raise BatchError(
            BatchReason.OTHER_HOST,
            f"instance {instance_uuid} runs on host {host_uuid}, "
            f"the round is host {round.host_uuid}'s",
        )
    _check_binding(round)
    if not round.host_attested:
        raise BatchError(
            BatchReason.HOST_UNTRUSTED,
            f"host {round.host_uuid} failed its attestation in that round",
        )
    age = now - round.at
    if age > max_age or age < 0:
        raise BatchError(
            BatchReason.STALE,
            f"the round of host {round.host_uuid} is {age:.1f} s old "
            f"(allowed 0..{max_age:g} s)",
        )
    _check_inclusion(round, leaf, proof, instance_uuid)


def _check_binding(round: HostRound) -> None:  # noqa: A002
    attest = TpmAttest.from_bytes(round.attest)
    expected = bind_nonce(host_nonce(round.fresh_nonce, round.root, round.size))
    if not hmac.compare_digest(attest.extra_data, expected):
        raise BatchError(
            BatchReason.BINDING,
            f"the quote of host {round.host_uuid} does not carry this round's "
            f"root and size ({round.size} leaves)",
        )


def _check_inclusion(
    round: HostRound,  # noqa: A002
    leaf: bytes,
    proof: BatchProof,
    instance_uuid: str,
) -> None:
    if proof.size != round.size:
        raise BatchError(
            BatchReason.PROOF,
            f"the proof of instance {instance_uuid} is for a batch of "
            f"{proof.size} leaves, the round's has {round.size}",
        )
    try:
        verify_inclusion(
            leaf_hash(leaf), proof.index, proof.size, proof.path, round.root
        )
    except LogProofError as exc:
        raise BatchError(
            BatchReason.PROOF,
            f"instance {instance_uuid} is not in the batch of host "
            f"{round.host_uuid}: {exc.reason}",
        ) from None
