"""RFC 9162 (Certificate Transparency v2) section 2.1: Merkle tree hashing,
inclusion proofs (2.1.3) and consistency proofs (2.1.4).

``MTH({}) = SHA-256()``, ``MTH({d}) = SHA-256(0x00 || d)`` and, for ``n > 1``
leaves split at ``k``, the largest power of two smaller than ``n``,
``MTH(D[n]) = SHA-256(0x01 || MTH(D[0:k]) || MTH(D[k:n]))``.

Storage view: every *complete perfect subtree* is addressed by
``(level, index)``; level 0 holds the leaf hashes and node ``(level, i)``
covers leaves ``[i * 2**level, (i + 1) * 2**level)``. Such a node never
changes once complete, so a store keeps exactly what :meth:`Frontier.append`
returns, and the proof builders read them back through a
:data:`NodeGetter` with O(log n) calls. Every range RFC 9162 hashes
(``D[k:n]`` in PATH and SUBPROOF) is made of O(log n) such nodes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from verifier.protocol.errors import EvidenceError, MalformedError

__all__ = [
    "EMPTY_ROOT",
    "HASH_SIZE",
    "MAX_SIZE",
    "Frontier",
    "LogProofError",
    "NodeGetter",
    "consistency_proof",
    "inclusion_proof",
    "leaf_hash",
    "node_hash",
    "root_from_leaves",
    "subtree_root",
    "verify_consistency",
    "verify_inclusion",
]

#: Size of every hash in the tree (SHA-256).
HASH_SIZE = 32
#: The root of the empty tree, SHA-256 of the empty string.
EMPTY_ROOT = hashlib.sha256(b"").digest()
#: Largest tree size and leaf index accepted (a signed 64-bit column).
MAX_SIZE = 2**63 - 1
#: Longest proof a tree of at most MAX_SIZE leaves can need.
_MAX_PROOF = 64

#: ``get(level, index)``: the hash of the complete perfect subtree
#: ``(level, index)``; may raise :class:`KeyError` (or another
#: :class:`LookupError`) when it has none.
NodeGetter = Callable[[int, int], bytes]


class LogProofError(EvidenceError):
    """A log proof, checkpoint or history that fails verification.

    ``reason`` is one of ``index_out_of_range``, ``bad_proof_length``,
    ``root_mismatch``, ``bad_proof``, ``missing_node``, ``bad_node``,
    ``unknown_key``, ``bad_signature``, ``wrong_origin``, ``forked``,
    ``wrong_node``, ``missing_entry``, ``out_of_order``.
    """


def leaf_hash(data: bytes) -> bytes:
    """``SHA-256(0x00 || data)``: the hash of one leaf (RFC 9162 2.1.1)."""
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """``SHA-256(0x01 || left || right)``: an interior node (RFC 9162 2.1.1)."""
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    """The largest power of two smaller than ``n`` (``n > 1``)."""
    return 1 << ((n - 1).bit_length() - 1)


def _is_count(value: object) -> bool:
    return type(value) is int and 0 <= value <= MAX_SIZE


def _is_hash(value: object) -> bool:
    return isinstance(value, bytes) and len(value) == HASH_SIZE


def root_from_leaves(leaves: Sequence[bytes]) -> bytes:
    """RFC 9162 ``MTH`` of the leaf *data* (reference; recursive, for tests
    and small trees).

    Raises:
        MalformedError: an item is not bytes.
    """
    if not all(isinstance(leaf, bytes) for leaf in leaves):
        raise MalformedError("log leaves", "every leaf must be bytes")
    if not leaves:
        return EMPTY_ROOT
    if len(leaves) == 1:
        return leaf_hash(leaves[0])
    k = _split(len(leaves))
    return node_hash(root_from_leaves(leaves[:k]), root_from_leaves(leaves[k:]))


class Frontier:
    """The right edge of a tree: the roots of the perfect subtrees of the
    binary decomposition of ``size``, largest (leftmost) first.

    Enough to append leaves and compute the root without the rest of the
    tree; what a store keeps in one row next to the nodes.

    Raises:
        MalformedError: ``hashes`` does not fit ``size``.
    """

    __slots__ = ("_hashes", "_size")

    def __init__(self, size: int = 0, hashes: Sequence[bytes] = ()) -> None:
        if not _is_count(size):
            raise MalformedError("log frontier", f"size must be 0..{MAX_SIZE}")
        if isinstance(hashes, (bytes, str)) or not isinstance(hashes, Sequence):
            raise MalformedError("log frontier", "hashes must be a sequence")
        hashes = list(hashes)
        if len(hashes) != size.bit_count():
            raise MalformedError(
                "log frontier", f"size {size} needs {size.bit_count()} hashes"
            )
        if not all(_is_hash(h) for h in hashes):
            raise MalformedError("log frontier", "every hash must be 32 bytes")
        self._size = size
        self._hashes = hashes

    @property
    def size(self) -> int:
        """Number of leaves."""
        return self._size

    @property
    def hashes(self) -> tuple[bytes, ...]:
        """The perfect subtrees' roots, largest first."""
        return tuple(self._hashes)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Frontier):
            return NotImplemented
        return self._size == other._size and self._hashes == other._hashes

    def __hash__(self) -> int:
        return hash((self._size, tuple(self._hashes)))

    def __repr__(self) -> str:
        return f"Frontier(size={self._size}, root={self.root().hex()[:16]}...)"

    def append(self, leaf: bytes) -> list[tuple[int, int, bytes]]:
        """Add a leaf hash (see :func:`leaf_hash`) at index ``size``.

        Returns:
            Every node completed by this leaf as ``(level, index, hash)``,
            the leaf itself ``(0, size, leaf)`` first, then upwards.

        Raises:
            MalformedError: ``leaf`` is not a 32-byte hash, or the tree is full.
        """
        if not _is_hash(leaf):
            raise MalformedError("log leaf", "must be a 32-byte hash")
        if self._size >= MAX_SIZE:
            raise MalformedError("log frontier", "the tree is full")
        index, level, node = self._size, 0, leaf
        completed = [(0, index, leaf)]
        while (self._size >> level) & 1:
            node = node_hash(self._hashes.pop(), node)
            level += 1
            completed.append((level, index >> level, node))
        self._hashes.append(node)
        self._size += 1
        return completed

    def root(self) -> bytes:
        """RFC 9162 ``MTH`` of the whole tree."""
        if not self._hashes:
            return EMPTY_ROOT
        root = self._hashes[-1]
        for left in reversed(self._hashes[:-1]):
            root = node_hash(left, root)
        return root

    def copy(self) -> Frontier:
        """An independent copy (appending to it leaves this one alone)."""
        return Frontier(self._size, self._hashes)

    def to_dict(self) -> dict[str, Any]:
        """``{"size": n, "hashes": [hex, ...]}``."""
        return {"size": self._size, "hashes": [h.hex() for h in self._hashes]}

    @classmethod
    def from_dict(cls, data: object) -> Frontier:
        """Parse :meth:`to_dict`'s form.

        Raises:
            MalformedError: wrong fields, types or lengths.
        """
        if not isinstance(data, Mapping) or set(data) != {"size", "hashes"}:
            raise MalformedError("log frontier", "fields must be size, hashes")
        size, texts = data["size"], data["hashes"]
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise MalformedError("log frontier", "hashes must be hex strings")
        if len(texts) > _MAX_PROOF:
            raise MalformedError("log frontier", "too many hashes")
        try:
            hashes = [bytes.fromhex(t) for t in texts]
        except ValueError:
            raise MalformedError("log frontier", "hashes must be hex strings") from None
        return cls(size, hashes)

    @classmethod
    def at(cls, size: int, get: NodeGetter) -> Frontier:
        """The frontier of the tree's first ``size`` leaves, read from a store.

        Raises:
            LogProofError: ``index_out_of_range``, ``missing_node``, ``bad_node``.
        """
        _check_count(size, "size")
        hashes, start = [], 0
        for level in range(size.bit_length() - 1, -1, -1):
            if (size >> level) & 1:
                hashes.append(_get(get, level, start >> level))
                start += 1 << level
        return cls(size, hashes)


def _check_count(value: object, what: str) -> None:
    if not _is_count(value):
        raise LogProofError("index_out_of_range", f"{what} must be 0..{MAX_SIZE}")


def _get(get: NodeGetter, level: int, index: int) -> bytes:
    try:
        value = get(level, index)
    except LookupError:
        raise LogProofError(
            "missing_node", f"the store has no node ({level}, {index})"
        ) from None
    if not _is_hash(value):
        raise LogProofError("bad_node", f"node ({level}, {index}) is not 32 bytes")
    return value


def _range_root(start: int, end: int, get: NodeGetter) -> bytes:
    """MTH of ``[start, end)``, ``0 <= start < end``, ``start`` aligned."""
    nodes = []
    while start < end:
        level = (end - start).bit_length() - 1
        nodes.append(_get(get, level, start >> level))
        start += 1 << level
    root = nodes.pop()
    while nodes:
        root = node_hash(nodes.pop(), root)
    return root


def subtree_root(start: int, end: int, get: NodeGetter) -> bytes:
    """RFC 9162 ``MTH(D[start:end])`` from at most log2(n) + 1 stored nodes.

    Args:
        start: first leaf; a multiple of the largest power of two not above
            ``end - start`` (how RFC 9162 ranges are aligned).
        end: one past the last leaf.
        get: reads complete perfect subtrees.

    Raises:
        LogProofError: ``index_out_of_range`` (an empty, reversed or
            unaligned range), ``missing_node``, ``bad_node``.
    """
    _check_count(start, "start")
    _check_count(end, "end")
    if start == end == 0:
        return EMPTY_ROOT
    if start >= end:
        raise LogProofError("index_out_of_range", f"empty range [{start}, {end})")
    if start % (1 << ((end - start).bit_length() - 1)):
        raise LogProofError("index_out_of_range", f"[{start}, {end}) is not aligned")
    return _range_root(start, end, get)


def inclusion_proof(index: int, size: int, get: NodeGetter) -> list[bytes]:
    """RFC 9162 2.1.3.1 ``PATH(index, D[size])``, leaf side first.

    Raises:
        LogProofError: ``index_out_of_range`` unless ``0 <= index < size``;
            ``missing_node``, ``bad_node`` from the store.
    """
    _check_count(index, "index")
    _check_count(size, "size")
    if index >= size:
        raise LogProofError("index_out_of_range", f"leaf {index} not in tree {size}")
    path = []
    start, end = 0, size
    while end - start > 1:
        k = _split(end - start)
        if index < start + k:
            path.append(_range_root(start + k, end, get))
            end = start + k
        else:
            path.append(_range_root(start, start + k, get))
            start += k
    path.reverse()
    return path


def consistency_proof(old: int, new: int, get: NodeGetter) -> list[bytes]:
    """RFC 9162 2.1.4.1 ``PROOF(old, D[new])``: that the tree of ``new``
    leaves extends the one of ``old`` leaves. Empty when ``old`` is 0 or
    equals ``new``.

    Raises:
        LogProofError: ``index_out_of_range`` unless ``0 <= old <= new``;
            ``missing_node``, ``bad_node`` from the store.
    """
    _check_count(old, "old size")
    _check_count(new, "new size")
    if old > new:
        raise LogProofError("index_out_of_range", f"old size {old} > new size {new}")
    if old == 0 or old == new:
        return []
    proof = []
    start, end, whole = 0, new, True
    while old != end:
        k = _split(end - start)
        if old <= start + k:
            proof.append(_range_root(start + k, end, get))
            end = start + k
        else:
            proof.append(_range_root(start, start + k, get))
            start += k
            whole = False
    if not whole:
        proof.append(_range_root(start, end, get))
    proof.reverse()
    return proof


def _check_proof(proof: Sequence[bytes], what: str) -> list[bytes]:
    if isinstance(proof, (bytes, str)) or not isinstance(proof, Sequence):
        raise MalformedError(what, "must be a sequence of hashes")
    if len(proof) > _MAX_PROOF:
        raise LogProofError("bad_proof_length", f"{what} has {len(proof)} hashes")
    if not all(_is_hash(h) for h in proof):
        raise MalformedError(what, "every hash must be 32 bytes")
    return list(proof)


def _inclusion_length(index: int, size: int) -> int:
    """Length of ``PATH(index, D[size])`` (the descent of
    :func:`inclusion_proof`, counted)."""
    length, start, end = 0, 0, size
    while end - start > 1:
        k = _split(end - start)
        start, end = (start, start + k) if index < start + k else (start + k, end)
        length += 1
    return length


def verify_inclusion(
    leaf: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes
) -> None:
    """RFC 9162 2.1.3.2: ``leaf`` (a leaf hash) is leaf ``index`` of the
    tree of ``size`` leaves whose root is ``root``.

    Raises:
        LogProofError: ``index_out_of_range``, ``bad_proof_length``,
            ``root_mismatch``.
        MalformedError: a hash that is not 32 bytes.
    """
    if not _is_hash(leaf) or not _is_hash(root):
        raise MalformedError("inclusion proof", "leaf and root must be 32 bytes")
    path = _check_proof(proof, "inclusion proof")
    _check_count(index, "index")
    _check_count(size, "size")
    if index >= size:
        raise LogProofError("index_out_of_range", f"leaf {index} not in tree {size}")
    if len(path) != _inclusion_length(index, size):
        raise LogProofError(
            "bad_proof_length",
            f"{len(path)} hashes, leaf {index} of {size} needs "
            f"{_inclusion_length(index, size)}",
        )
    fn, sn, r = index, size - 1, leaf
    for p in path:
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            while not fn & 1 and fn:
                fn, sn = fn >> 1, sn >> 1
        else:
            r = node_hash(r, p)
        fn, sn = fn >> 1, sn >> 1
    if sn != 0 or r != root:
        raise LogProofError("root_mismatch", f"leaf {index} does not lead to the root")


def _consistency_length(old: int, new: int) -> int:
    """Length of ``PROOF(old, D[new])`` for ``0 < old < new`` (the descent
    of :func:`consistency_proof`, counted)."""
    length, start, end, whole = 0, 0, new, True
    while old != end:
        k = _split(end - start)
        if old <= start + k:
            end = start + k
        else:
            start, whole = start + k, False
        length += 1
    return length + (not whole)


def verify_consistency(
    old: int, new: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]
) -> None:
    """RFC 9162 2.1.4.2: the tree of ``new`` leaves with root ``new_root``
    extends the tree of ``old`` leaves with root ``old_root``.

    Raises:
        LogProofError: ``index_out_of_range`` (``old > new``),
            ``bad_proof_length``, ``bad_proof`` (the proof does not lead to
            both roots: the trees differ).
        MalformedError: a hash that is not 32 bytes.
    """
    if not _is_hash(old_root) or not _is_hash(new_root):
        raise MalformedError("consistency proof", "roots must be 32 bytes")
    path = _check_proof(proof, "consistency proof")
    _check_count(old, "old size")
    _check_count(new, "new size")
    if old > new:
        raise LogProofError("index_out_of_range", f"old size {old} > new size {new}")
    if old == 0 or old == new:
        if path:
            raise LogProofError("bad_proof_length", "the proof must be empty")
        if old == new and old_root != new_root:
            raise LogProofError("bad_proof", f"two different trees of size {old}")
        if old == 0 and old_root != EMPTY_ROOT:
            raise LogProofError("bad_proof", "the empty tree has another root")
        return
    if len(path) != _consistency_length(old, new):
        raise LogProofError(
            "bad_proof_length",
            f"{len(path)} hashes, {old} -> {new} needs {_consistency_length(old, new)}",
        )
    if old & (old - 1) == 0:
        path.insert(0, old_root)
    fn, sn = old - 1, new - 1
    while fn & 1:
        fn, sn = fn >> 1, sn >> 1
    fr = sr = path[0]
    for c in path[1:]:
        if fn & 1 or fn == sn:
            fr, sr = node_hash(c, fr), node_hash(c, sr)
            while not fn & 1 and fn:
                fn, sn = fn >> 1, sn >> 1
        else:
            sr = node_hash(sr, c)
        fn, sn = fn >> 1, sn >> 1
    if sn != 0 or fr != old_root or sr != new_root:
        raise LogProofError(
            "bad_proof", f"the tree of {new} does not extend the tree of {old}"
        )
