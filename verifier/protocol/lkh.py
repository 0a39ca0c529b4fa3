"""Group keys in a d-ary logical key hierarchy (LKH, as used by Ensemble).

Wong, Gouda and Lam, "Secure group communications using key graphs"
(SIGCOMM 1998); Rodeh, Birman and Dolev, "Using AVL trees for fault-tolerant
group key management" (Ensemble, 2002).

The controller (:class:`LkhTree`) keeps one key per tree node; a member
holds the keys on the path from its leaf to the root, and the root key is the
group key. Nodes are named ``(level, index)`` with leaves on level 0, so the
tree grows by adding a root on top without renaming anything.

* **join**: the new member's path gets fresh keys; each refreshed key that
  old members held goes out wrapped under its own old key (one entry per
  level); the newcomer gets its path in a :class:`Welcome` over mTLS.
* **revoke** (a batch): every node above a removed leaf gets a fresh key,
  wrapped under each remaining child's (already refreshed) key, bottom-up,
  so revocations in one batch share their path updates and one revocation
  costs at most ``d * log_d(n)`` wrapped keys.

A :class:`RekeyMessage` names its group and epoch and is signed (Ed25519) by
the controller; keys are wrapped with AES key wrap (RFC 3394). A
:class:`LkhMember` applies messages strictly in epoch order and rejects
duplicated, out-of-order, foreign or forged ones with :class:`LkhError`
(counted); after a gap it needs a fresh :class:`Welcome` (resync, e.g. after
re-attestation).
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import heapq
import os
import struct
from collections.abc import Iterable, Mapping
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.hazmat.primitives.keywrap import (
    InvalidUnwrap,
    aes_key_unwrap,
    aes_key_wrap,
)

from verifier.protocol.errors import EvidenceError, MalformedError

__all__ = ["Entry", "LkhError", "LkhMember", "LkhTree", "RekeyMessage", "Welcome"]

_KEY_BYTES = 32
NodeId = tuple[int, int]  # (level, index); leaves are level 0
_MAGIC = b"LKH1"
_HEAD = struct.Struct(">QBI")  # epoch, height, root version
_ENTRY = struct.Struct(">BIIBII40s")
_SIG = 64


class LkhError(EvidenceError):
    """A rekey message a member must not apply.

    ``reason`` is one of ``wrong_group``, ``duplicate``, ``stale``, ``gap``
    (out of order: resync needed), ``bad_signature``, ``bad_wrap``,
    ``evicted`` (the member is no longer in the group).
    """


@dataclasses.dataclass(frozen=True)
class Entry:
    """``target``'s key (version ``target_version``) wrapped under ``wrap``'s."""

    target: NodeId
    target_version: int
    wrap: NodeId
    wrap_version: int
    ciphertext: bytes


@dataclasses.dataclass(frozen=True)
class RekeyMessage:
    """One rekey operation: the group moves to ``epoch``."""

    group: str
    epoch: int
    height: int
    root_version: int
    entries: tuple[Entry, ...]
    signature: bytes = b""

    def signed_bytes(self) -> bytes:
        gid = self.group.encode()
        out = [_MAGIC, struct.pack(">H", len(gid)), gid]
        out.append(_HEAD.pack(self.epoch, self.height, self.root_version))
        out.append(struct.pack(">I", len(self.entries)))
        for e in self.entries:
            out.append(
                _ENTRY.pack(
                    e.target[0],
                    e.target[1],
                    e.target_version,
                    e.wrap[0],
                    e.wrap[1],
                    e.wrap_version,
                    e.ciphertext,
                )  # fmt: skip
            )
        return b"".join(out)

    def to_bytes(self) -> bytes:
        return self.signed_bytes() + self.signature

    @classmethod
    def from_bytes(cls, data: bytes) -> RekeyMessage:
        """Parse (does not verify the signature: members do on apply).

        Raises:
            MalformedError: naming what is wrong.
        """
        try:
            if data[:4] != _MAGIC:
                raise MalformedError("rekey message", "bad magic")
            (glen,) = struct.unpack_from(">H", data, 4)
            group = data[6 : 6 + glen].decode()
            off = 6 + glen
            epoch, height, root_version = _HEAD.unpack_from(data, off)
            off += _HEAD.size
            (count,) = struct.unpack_from(">I", data, off)
            off += 4
            entries = []
            for _ in range(count):
                tl, ti, tv, wl, wi, wv, ct = _ENTRY.unpack_from(data, off)
                entries.append(Entry((tl, ti), tv, (wl, wi), wv, ct))
                off += _ENTRY.size
        except (struct.error, UnicodeDecodeError) as exc:
            raise MalformedError("rekey message", f"truncated or garbled: {exc}")
        signature = data[off:]
        if len(signature) != _SIG:
            raise MalformedError("rekey message", "signature must be 64 bytes")
        return cls(group, epoch, height, root_version, tuple(entries), signature)


@dataclasses.dataclass(frozen=True)
class Welcome:
    """A member's path keys at ``epoch`` (secret: send only over mTLS)."""

    group: str
    member: str
    epoch: int
    height: int
    slot: int
    keys: Mapping[NodeId, tuple[int, bytes]]  # node -> (version, key)

    def to_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "member": self.member,
            "epoch": self.epoch,
            "height": self.height,
            "slot": self.slot,
            "keys": [
                [lv, ix, ver, base64.b64encode(k).decode()]
                for (lv, ix), (ver, k) in sorted(self.keys.items())
            ],
        }

    @classmethod
    def from_dict(cls, data: object) -> Welcome:
        """Raises: MalformedError naming the bad field."""
        try:
            assert isinstance(data, Mapping)
            keys = {
                (int(lv), int(ix)): (int(ver), base64.b64decode(k, validate=True))
                for lv, ix, ver, k in data["keys"]
            }
            w = cls(
                str(data["group"]),
                str(data["member"]),
                int(data["epoch"]),
                int(data["height"]),
                int(data["slot"]),
                keys,
            )
        except (AssertionError, KeyError, TypeError, ValueError) as exc:
            raise MalformedError("welcome", f"bad fields: {exc}")
        if any(len(k) != _KEY_BYTES for _, k in w.keys.values()):
            raise MalformedError("welcome", f"keys must be {_KEY_BYTES} bytes")
        return w


def _path(slot: int, height: int, d: int) -> list[NodeId]:
    """Leaf ``slot``'s path, leaf first, root ``(height, 0)`` last."""
    return [(level, slot // d**level) for level in range(height + 1)]


class LkhTree:
    """The group controller's tree (held by the key service).

    Args:
        group: the group id (named in every message).
        signing_key: signs rekey messages.
        degree: d, children per node (>= 2).
    """

    def __init__(
        self, group: str, signing_key: ed25519.Ed25519PrivateKey, degree: int = 4
    ) -> None:
        if degree < 2:
            raise ValueError("degree must be >= 2")
        self.group = group
        self.degree = degree
        self.epoch = 0
        self.height = 1
        self._signing_key = signing_key
        self._versions = 0  # unique across the tree, so no stale key matches
        self._keys: dict[NodeId, tuple[int, bytes]] = {(1, 0): self._fresh()}
        self._count: collections.Counter[NodeId] = collections.Counter()
        self._slots: dict[str, int] = {}
        self._free: list[int] = []
        self._next = 0

    def _fresh(self) -> tuple[int, bytes]:
        self._versions += 1
        return self._versions, os.urandom(_KEY_BYTES)

    # -- queries -----------------------------------------------------------

    @property
    def root(self) -> NodeId:
        return (self.height, 0)

    def group_key(self) -> bytes:
        return self._keys[self.root][1]

    def members(self) -> list[str]:
        return sorted(self._slots)

    def __contains__(self, member: object) -> bool:
        return member in self._slots

    def welcome(self, member: str) -> Welcome:
        """``member``'s current path keys (join, or resync after a gap).

        Raises:
            KeyError: if ``member`` is not in the group.
        """
        slot = self._slots[member]
        path = _path(slot, self.height, self.degree)
        keys = {n: self._keys[n] for n in path}
        return Welcome(self.group, member, self.epoch, self.height, slot, keys)

    # -- membership ----------------------------------------------------------

    def _allocate(self) -> int:
        if self._free:
            return heapq.heappop(self._free)
        slot = self._next
        self._next += 1
        return slot

    def bulk_add(self, members: Iterable[str]) -> None:
        """Seat members without rekey messages (an initial group: each one
        gets its keys by :meth:`welcome`)."""
        for member in members:
            if member in self._slots:
                continue
            slot = self._allocate()
            while slot >= self.degree**self.height:
                self._grow()
                self._keys[self.root] = self._fresh()
            self._slots[member] = slot
            for node in _path(slot, self.height, self.degree):
                self._count[node] += 1
                if node not in self._keys:
                    self._keys[node] = self._fresh()

    def join(self, member: str) -> tuple[RekeyMessage, Welcome]:
        """Add ``member``; old members learn the refreshed path keys.

        Raises:
            ValueError: if ``member`` is already in the group.
        """
        if member in self._slots:
            raise ValueError(f"{member} is already in group {self.group}")
        slot = self._allocate()
        old_keys = dict(self._keys)
        while slot >= self.degree**self.height:
            self._grow()
        self._slots[member] = slot
        path = _path(slot, self.height, self.degree)
        for node in path:
            self._count[node] += 1
        self._keys[path[0]] = self._fresh()
        entries: list[Entry] = []
        for child, node in zip(path, path[1:], strict=False):
            self._keys[node] = self._fresh()
            if node in old_keys and self._count[node] > 1:
                entries.append(self._entry(node, node, old_keys[node]))
            elif node not in old_keys:  # a new node: wrap for old children
                for other in self._children(node):
                    if other != child and other in old_keys:
                        entries.append(self._entry(node, other, self._keys[other]))
        message = self._emit(entries)
        return message, self.welcome(member)

    def revoke(self, members: Iterable[str]) -> RekeyMessage:
        """Remove ``members`` (one batch, shared path updates).

        Unknown members are ignored, so handling a revocation twice is
        harmless (it still rekeys: the returned message moves the epoch).
        """
        affected: set[NodeId] = set()
        for member in set(members):
            slot = self._slots.pop(member, None)
            if slot is None:
                continue
            heapq.heappush(self._free, slot)
            path = _path(slot, self.height, self.degree)
            for node in path:
                self._count[node] -= 1
                if not self._count[node]:
                    del self._count[node]
            self._keys.pop(path[0], None)
            affected.update(path[1:])
        entries: list[Entry] = []
        for node in sorted(affected):  # bottom-up: children before parents
            if node != self.root and node not in self._count:
                self._keys.pop(node, None)
                continue
            self._keys[node] = self._fresh()
            for child in self._children(node):
                entries.append(self._entry(node, child, self._keys[child]))
        return self._emit(entries)

    def _grow(self) -> None:
        """Add a level on top: the old root becomes the new root's first child."""
        self.height += 1
        self._count[self.root] = len(self._slots)

    def _children(self, node: NodeId) -> list[NodeId]:
        level, index = node
        first = index * self.degree
        kids = [(level - 1, first + k) for k in range(self.degree)]
        return [c for c in kids if c in self._count and c in self._keys]

    def _entry(
        self, target: NodeId, wrap: NodeId, wrap_key: tuple[int, bytes]
    ) -> Entry:
        version, key = self._keys[target]
        ct = aes_key_wrap(wrap_key[1], key)
        return Entry(target, version, wrap, wrap_key[0], ct)

    def _emit(self, entries: list[Entry]) -> RekeyMessage:
        self.epoch += 1
        root_version = self._keys[self.root][0]
        msg = RekeyMessage(
            self.group, self.epoch, self.height, root_version, tuple(entries)
        )
        signature = self._signing_key.sign(msg.signed_bytes())
        return dataclasses.replace(msg, signature=signature)


class LkhMember:
    """A member's side: its path keys and the group epoch.

    Args:
        welcome: from the controller (join or resync).
        controller_key: verifies rekey messages.
        degree: the tree's d.

    Attributes:
        rejected: counts of refused messages by reason.
    """

    def __init__(
        self,
        welcome: Welcome,
        controller_key: ed25519.Ed25519PublicKey,
        degree: int = 4,
    ) -> None:
        self._controller_key = controller_key
        self.degree = degree
        self.rejected: collections.Counter[str] = collections.Counter()
        self.resync(welcome)

    def resync(self, welcome: Welcome) -> None:
        """Replace all state with a fresh welcome (after a gap)."""
        self.group = welcome.group
        self.member = welcome.member
        self.epoch = welcome.epoch
        self.height = welcome.height
        self.slot = welcome.slot
        self._keys = dict(welcome.keys)

    def group_key(self) -> bytes:
        return self._keys[(self.height, 0)][1]

    def _refuse(self, reason: str, detail: str) -> LkhError:
        self.rejected[reason] += 1
        return LkhError(reason, detail)

    def apply(self, message: RekeyMessage) -> bytes:
        """Apply the next rekey message; the new group key.

        Raises:
            LkhError: the message is refused (state unchanged).
        """
        if message.group != self.group:
            raise self._refuse(
                "wrong_group",
                f"message for group {message.group!r}, not {self.group!r}",
            )
        if message.epoch == self.epoch:
            raise self._refuse("duplicate", f"epoch {message.epoch} already applied")
        if message.epoch < self.epoch:
            raise self._refuse("stale", f"epoch {message.epoch} < {self.epoch}")
        if message.epoch != self.epoch + 1:
            raise self._refuse(
                "gap", f"expected epoch {self.epoch + 1}, got {message.epoch}: resync"
            )
        try:
            self._controller_key.verify(message.signature, message.signed_bytes())
        except InvalidSignature:
            raise self._refuse("bad_signature", "rekey message signature is invalid")
        keys = dict(self._keys)
        path = set(_path(self.slot, message.height, self.degree))
        for e in message.entries:
            held = keys.get(e.wrap)
            if e.target not in path or held is None or held[0] != e.wrap_version:
                continue
            try:
                keys[e.target] = (
                    e.target_version,
                    aes_key_unwrap(held[1], e.ciphertext),
                )
            except InvalidUnwrap:
                raise self._refuse("bad_wrap", f"entry for {e.target} does not unwrap")
        root = keys.get((message.height, 0))
        if root is None or root[0] != message.root_version:
            raise self._refuse("evicted", f"{self.member} cannot derive the group key")
        self._keys, self.epoch, self.height = keys, message.epoch, message.height
        return root[1]
