"""Monitor attestation: the verifier proves its own integrity (Excalibur).

A customer sends a fresh nonce; the verifier host's TPM quotes its PCRs.
So that one TPM quote (tens of milliseconds) serves many customers, the
nonces that arrive within a short window form a batch: a Merkle tree is
built over them, the TPM quotes once over the root, and each customer gets
the quote plus the inclusion path of its own nonce.

Tree (domain-separated like RFC 9162, section 2.1.1)::

    leaf  = SHA-256(0x00 || nonce)
    inner = SHA-256(0x01 || left || right)

Levels are paired left to right; an odd last node is carried up unchanged.
The shape is fixed by the batch size, so (index, size, path) determines
exactly which siblings sit left or right, and a path of the wrong length
is refused. The quote's qualifying data binds the root and the size::

    SHA-256("trusted-cloud monitor v1" 0x00 || u32 size || root)

:func:`verify_monitor_attestation` is the customer's check: the nonce is a
leaf of the quoted root, the quote is signed by the verifier's pinned AK,
and the quoted PCRs satisfy the expected policy. Pure: no I/O, no clock.
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
from collections.abc import Mapping, Sequence
from typing import Any

from verifier.protocol.errors import EvidenceError, MalformedError
from verifier.protocol.policy import PcrPolicy
from verifier.protocol.quote import (
    AttestationKey,
    ClockState,
    Quote,
    verify_quote,
)

__all__ = [
    "MAX_BATCH",
    "MAX_NONCE",
    "MIN_NONCE",
    "MerkleTree",
    "MonitorAttestation",
    "MonitorVerdict",
    "check_nonce",
    "leaf_hash",
    "monitor_qualifying_data",
    "root_from_path",
    "verify_monitor_attestation",
]

MIN_NONCE = 16
MAX_NONCE = 64
MAX_BATCH = 1 << 20
_MAX_DEPTH = 20
_LABEL = b"trusted-cloud monitor v1\x00"
_STRUCT = "monitor attestation"


def check_nonce(nonce: bytes) -> None:
    """Raises: MalformedError if ``nonce`` is not 16..64 bytes."""
    if not isinstance(nonce, bytes) or not MIN_NONCE <= len(nonce) <= MAX_NONCE:
        raise MalformedError(
            "monitor nonce", f"must be {MIN_NONCE} to {MAX_NONCE} bytes"
        )


def leaf_hash(nonce: bytes) -> bytes:
    """The tree leaf of one customer nonce."""
    return hashlib.sha256(b"\x00" + nonce).digest()


def _inner(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def monitor_qualifying_data(root: bytes, size: int) -> bytes:
    """What the verifier's TPM quote carries in extraData for a batch."""
    return hashlib.sha256(_LABEL + struct.pack(">I", size) + root).digest()


class MerkleTree:
    """The tree over one batch of nonces.

    Args:
        nonces: the batch, in arrival order (1 to :data:`MAX_BATCH`).

    Raises:
        MalformedError: empty or oversized batch, or a bad nonce.
    """

    def __init__(self, nonces: Sequence[bytes]) -> None:
        if not 1 <= len(nonces) <= MAX_BATCH:
            raise MalformedError("monitor batch", f"size must be 1..{MAX_BATCH}")
        for nonce in nonces:
            check_nonce(nonce)
        level = [leaf_hash(n) for n in nonces]
        self.levels: list[list[bytes]] = [level]
        while len(level) > 1:
            up = [_inner(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
            if len(level) % 2:
                up.append(level[-1])
            self.levels.append(up)
            level = up

    @property
    def size(self) -> int:
        return len(self.levels[0])

    @property
    def root(self) -> bytes:
        return self.levels[-1][0]

    def path(self, index: int) -> tuple[bytes, ...]:
        """The siblings from leaf ``index`` up to the root.

        Raises:
            IndexError: ``index`` is not in the batch.
        """
        if not 0 <= index < self.size:
            raise IndexError(f"leaf {index} not in a batch of {self.size}")
        siblings = []
        for level in self.levels[:-1]:
            sibling = index ^ 1
            if sibling < len(level):
                siblings.append(level[sibling])
            index //= 2
        return tuple(siblings)


def root_from_path(nonce: bytes, index: int, size: int, path: Sequence[bytes]) -> bytes:
    """Recompute the root a nonce's inclusion path leads to.

    Raises:
        MalformedError: index/size out of range, or a path that does not
            have exactly the length this position in this size demands.
    """
    check_nonce(nonce)
    if not 1 <= size <= MAX_BATCH or not 0 <= index < size:
        raise MalformedError(_STRUCT, f"leaf {index} of a batch of {size}")
    node = leaf_hash(nonce)
    used = 0
    width = size
    while width > 1:
        if index % 2 or index + 1 < width:
            if used >= len(path):
                raise MalformedError(_STRUCT, "inclusion path too short")
            sibling = path[used]
            used += 1
            node = _inner(sibling, node) if index % 2 else _inner(node, sibling)
        index //= 2
        width = (width + 1) // 2
    if used != len(path):
        raise MalformedError(_STRUCT, "inclusion path too long")
    return node


@dataclasses.dataclass(frozen=True)
class MonitorAttestation:
    """One customer's reply: the batch quote and its nonce's position.

    Attributes:
        quote: the verifier host TPM's quote over the batch root.
        index: the nonce's leaf index.
        size: the number of nonces in the batch.
        path: sibling hashes from the leaf up.
    """

    quote: Quote
    index: int
    size: int
    path: tuple[bytes, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "quote": self.quote.to_dict(),
            "index": self.index,
            "size": self.size,
            "path": [p.hex() for p in self.path],
        }

    @classmethod
    def from_dict(cls, data: object) -> MonitorAttestation:
        """Parse the JSON form.

        Raises:
            MalformedError: naming the bad field.
        """
        if not isinstance(data, Mapping):
            raise MalformedError(_STRUCT, "must be an object")
        quote = Quote.from_dict(data.get("quote"))
        index, size, path = data.get("index"), data.get("size"), data.get("path")
        if type(index) is not int or type(size) is not int:
            raise MalformedError(_STRUCT, "'index' and 'size' must be integers")
        if not isinstance(path, list) or len(path) > _MAX_DEPTH:
            raise MalformedError(_STRUCT, f"'path' must be a list of <= {_MAX_DEPTH}")
        hashes = []
        for item in path:
            try:
                raw = bytes.fromhex(item)
            except (TypeError, ValueError):
                raise MalformedError(_STRUCT, "'path' items must be hex")
            if len(raw) != 32:
                raise MalformedError(_STRUCT, "'path' items must be 32 bytes")
            hashes.append(raw)
        return cls(quote, index, size, tuple(hashes))


@dataclasses.dataclass(frozen=True)
class MonitorVerdict:
    """A successful monitor attestation (failures raise)."""

    root: bytes
    size: int
    clock: ClockState
    pcr_values: Mapping[int, bytes]

    def __bool__(self) -> bool:
        return True


def verify_monitor_attestation(
    attestation: MonitorAttestation,
    *,
    nonce: bytes,
    ak: AttestationKey,
    policy: PcrPolicy,
    previous_clock: ClockState | None = None,
) -> MonitorVerdict:
    """The customer's check of the verifier's integrity.

    Args:
        attestation: the verifier's reply.
        nonce: the fresh nonce the customer sent.
        ak: the verifier host's AK as the customer trusts it (pinned).
        policy: the PCR values the customer accepts for the verifier host.
        previous_clock: the TPM clock of the last accepted attestation, to
            refuse a replayed older quote even with a colliding nonce.

    Returns:
        The verdict with the quoted PCR values and TPM clock.

    Raises:
        MalformedError: the reply or the path does not parse.
        EvidenceError: ``nonce_not_in_batch`` (the quote is not over a batch
            holding this nonce: replay, tampered path, wrong nonce), or the
            reason :func:`verify_quote` gives (``signature_invalid`` for
            another AK, ``pcr_policy``, ``clock_rollback``, ...).
    """
    root = root_from_path(nonce, attestation.index, attestation.size, attestation.path)
    try:
        verdict = verify_quote(
            attestation.quote,
            ak=ak,
            qualifying_data=monitor_qualifying_data(root, attestation.size),
            policy=policy,
            previous_clock=previous_clock,
        )
    except EvidenceError as exc:
        if exc.reason == "nonce_mismatch":
            raise EvidenceError(
                "nonce_not_in_batch",
                "the quote is not over a batch that includes this nonce",
            )
        raise
    return MonitorVerdict(root, attestation.size, verdict.clock, verdict.pcr_values)
