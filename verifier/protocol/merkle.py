"""Sealed objects as 4 KB blocks under a signed Merkle tree (after Plutus).

An object is cut into 4 KB blocks; each block is encrypted on its own
(AES-256-GCM under the filegroup key of one key-regression version, with the
object id, version and block index as associated data). The leaves of a
SHA-256 Merkle tree are the ciphertext blocks, and the writer signs the root
(Ed25519) together with the object id, key version, length and block count.
A reader (or the untrusted store itself, which needs no key) can then check
any single block with its authentication path, without the other blocks.

Hashing: ``leaf = H(0x00 || index || block)``, ``node = H(0x01 || l || r)``;
an unpaired node at the end of a level moves up unchanged.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import os
import struct

from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from verifier.protocol.errors import EvidenceError, MalformedError

__all__ = [
    "BLOCK",
    "BlockError",
    "BlockVerifier",
    "Header",
    "SealedObject",
    "auth_path",
    "merkle_root",
    "seal_object",
]

BLOCK = 4096
_NONCE = 12


class BlockError(EvidenceError):
    """A block or header that fails verification.

    ``reason`` is ``bad_signature``, ``bad_path`` (the block's hash does not
    lead to the signed root), ``bad_index`` or ``bad_block`` (decryption).
    """


def _leaf(index: int, block: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + struct.pack(">Q", index) + block).digest()


def _node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _levels(leaves: list[bytes]) -> list[list[bytes]]:
    levels = [leaves]
    while len(levels[-1]) > 1:
        cur = levels[-1]
        nxt = [_node(cur[i], cur[i + 1]) for i in range(0, len(cur) - 1, 2)]
        if len(cur) % 2:
            nxt.append(cur[-1])
        levels.append(nxt)
    return levels


def merkle_root(blocks: list[bytes]) -> bytes:
    """The root over ciphertext blocks (at least one)."""
    return _levels([_leaf(i, b) for i, b in enumerate(blocks)])[-1][0]


def auth_path(blocks: list[bytes], index: int) -> list[bytes]:
    """Sibling hashes from block ``index`` up to the root."""
    path = []
    for level in _levels([_leaf(i, b) for i, b in enumerate(blocks)])[:-1]:
        sibling = index ^ 1
        if sibling < len(level):
            path.append(level[sibling])
        index //= 2
    return path


def _root_from_path(index: int, count: int, leaf: bytes, path: list[bytes]) -> bytes:
    node, width, it = leaf, count, iter(path)
    while width > 1:
        if index % 2:
            node = _node(next(it), node)
        elif index + 1 < width:
            node = _node(node, next(it))
        index, width = index // 2, (width + 1) // 2
    if next(it, None) is not None:
        raise ValueError("path too long")
    return node


@dataclasses.dataclass(frozen=True)
class Header:
    """The signed description of a sealed object."""

    obj: str
    version: int
    length: int
    blocks: int
    root: bytes
    signature: bytes = b""

    def signed_bytes(self) -> bytes:
        fields = {
            "object": self.obj,
            "version": self.version,
            "length": self.length,
            "blocks": self.blocks,
            "root": self.root.hex(),
        }
        return b"tc-merkle-v1" + json.dumps(fields, sort_keys=True).encode()

    def to_dict(self) -> dict[str, object]:
        return {
            "object": self.obj,
            "version": self.version,
            "length": self.length,
            "blocks": self.blocks,
            "root": self.root.hex(),
            "signature": self.signature.hex(),
        }

    @classmethod
    def from_dict(cls, data: object) -> Header:
        """Raises: MalformedError naming the problem."""
        try:
            assert isinstance(data, dict)
            h = cls(
                str(data["object"]),
                int(data["version"]),
                int(data["length"]),
                int(data["blocks"]),
                bytes.fromhex(data["root"]),
                bytes.fromhex(data["signature"]),
            )
        except (AssertionError, KeyError, TypeError, ValueError) as exc:
            raise MalformedError("sealed object header", f"bad fields: {exc}")
        if h.blocks != max(1, -(-h.length // BLOCK)) or len(h.root) != 32:
            raise MalformedError("sealed object header", "inconsistent sizes")
        return h


@dataclasses.dataclass(frozen=True)
class SealedObject:
    """A header and its ciphertext blocks (nonce || AES-GCM ciphertext)."""

    header: Header
    blocks: list[bytes]

    def path(self, index: int) -> list[bytes]:
        return auth_path(self.blocks, index)


def _aad(obj: str, version: int, index: int) -> bytes:
    return json.dumps([obj, version, index]).encode()


def seal_object(
    obj: str,
    data: bytes,
    version: int,
    key: bytes,
    signing_key: ed25519.Ed25519PrivateKey,
) -> SealedObject:
    """Encrypt ``data`` block by block under ``key`` (version ``version``)
    and sign the Merkle root."""
    aead = AESGCM(key)
    chunks = [data[i : i + BLOCK] for i in range(0, len(data), BLOCK)] or [b""]
    blocks = []
    for i, chunk in enumerate(chunks):
        nonce = os.urandom(_NONCE)
        blocks.append(nonce + aead.encrypt(nonce, chunk, _aad(obj, version, i)))
    unsigned = Header(obj, version, len(data), len(blocks), merkle_root(blocks))
    signature = signing_key.sign(unsigned.signed_bytes())
    return SealedObject(dataclasses.replace(unsigned, signature=signature), blocks)


class BlockVerifier:
    """Checks headers and single blocks; counts refusals by reason.

    Args:
        writer_key: the public key that signs roots of this filegroup.
    """

    def __init__(self, writer_key: ed25519.Ed25519PublicKey) -> None:
        self._writer_key = writer_key
        self.rejected: collections.Counter[str] = collections.Counter()

    def _refuse(self, reason: str, detail: str) -> BlockError:
        self.rejected[reason] += 1
        return BlockError(reason, detail)

    def check_header(self, header: Header) -> Header:
        """Raises: BlockError ``bad_signature``."""
        try:
            self._writer_key.verify(header.signature, header.signed_bytes())
        except InvalidSignature:
            raise self._refuse("bad_signature", f"root of {header.obj} not signed")
        return header

    def check_block(
        self, header: Header, index: int, block: bytes, path: list[bytes]
    ) -> bytes:
        """Check one ciphertext block against a (checked) header.

        Raises:
            BlockError: ``bad_index`` or ``bad_path``.
        """
        if not 0 <= index < header.blocks:
            raise self._refuse("bad_index", f"block {index} of {header.blocks}")
        try:
            root = _root_from_path(index, header.blocks, _leaf(index, block), path)
        except (StopIteration, ValueError):
            raise self._refuse("bad_path", f"block {index}: path has the wrong length")
        if root != header.root:
            raise self._refuse("bad_path", f"block {index} does not match the root")
        return block

    def read_block(
        self, header: Header, index: int, block: bytes, path: list[bytes], key: bytes
    ) -> bytes:
        """Verify one block alone and decrypt it.

        Raises:
            BlockError: any failed check (``bad_block`` if it does not decrypt).
        """
        self.check_header(header)
        self.check_block(header, index, block, path)
        try:
            aad = _aad(header.obj, header.version, index)
            return AESGCM(key).decrypt(block[:_NONCE], block[_NONCE:], aad)
        except InvalidTag:
            raise self._refuse(
                "bad_block", f"block {index} does not decrypt (wrong key version?)"
            )
