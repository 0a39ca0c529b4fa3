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
   ``bind_nonce(host_nonce(...), *bound)`` like any quote's (``bound``: what
   the agent binds after the nonce, its NK public key in pull mode);
3. the verifier judges the host quote and records the round as a
   :class:`HostRound`; a guest in the batch is then "quoted while its host
   was in this attested state", checked by :func:`verify_guest_in_batch`
   with the guest's :class:`BatchProof`.

Byte layouts (``u16``/``u64`` big-endian)::

    guest_leaf = "trusted-cloud batch leaf v1" 0x00 || uuid (16 bytes)
                 || SHA-256(guest TPMS_ATTEST)                  (76 bytes)
    host_nonce = SHA-256("trusted-cloud batch root v1" 0x00
                         || u16 len(fresh) || fresh || root (32) || u64 size)
    extraData  = bind_nonce(host_nonce, *bound)   (verifier.protocol.quote)

Pure: no I/O, and no clock but the ``now`` the caller passes.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import uuid as uuid_mod
from collections.abc import Sequence

from verifier.protocol import _marshal as m
from verifier.protocol._hostbatch_wire import (
    MAX_BOUND,
    MAX_NONCE,
    MIN_NONCE,
    BatchProof,
    HostRound,
    check_hash,
    check_nonce,
    is_count,
    is_time,
    uuid_of,
)
from verifier.protocol.errors import EvidenceError, MalformedError
from verifier.protocol.quote import bind_nonce
from verifier.protocol.tpm import TpmAttest
from verifier.protocol.translog.tree import (
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
    "MAX_BOUND",
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
    node = uuid_of(instance_uuid, "batch leaf")
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
    fresh = check_nonce(fresh_nonce)
    digest = check_hash(root, "host nonce root")
    if not is_count(size):
        raise MalformedError("host nonce", f"size must be 0..{MAX_SIZE}")
    h = hashlib.sha256(NONCE_LABEL)
    h.update(m.u16(len(fresh)) + fresh + digest + m.u64(size))
    return h.digest()


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
    if not is_time(now) or not is_time(max_age) or max_age <= 0:
        raise MalformedError(
            "batch check", "now and max_age must be finite, max_age > 0"
        )
    leaf = guest_leaf(instance_uuid, vtpm_attest)
    if uuid_of(host_uuid, "batch check host_uuid") != uuid_mod.UUID(round.host_uuid):
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
    nonce = host_nonce(round.fresh_nonce, round.root, round.size)
    expected = bind_nonce(nonce, *round.bound)
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
