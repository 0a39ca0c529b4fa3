"""Canonical, versioned byte encoding of CP-ABE structures (no pickle).

Every structure is ``MAGIC || VERSION || KIND`` followed by fields. A field
is either a fixed-size group element (G1 48 bytes, G2 96, GT 576, Fr 32;
mcl's compressed BLS12-381 encodings, checked on decoding for curve and
subgroup membership) or a ``u32`` big-endian length and that many bytes.
Decoding is strict: exact lengths, no trailing bytes, and every failure is a
:class:`~verifier.protocol.errors.MalformedError` naming the structure.
"""

from __future__ import annotations

import struct
from typing import TypeVar

import pymcl

from verifier.protocol.errors import MalformedError

__all__ = ["MAGIC", "VERSION", "Reader", "Writer"]

MAGIC = b"TCABE"
VERSION = 1

KIND_PUBLIC_PARAMS = 1
KIND_MASTER_KEY = 2
KIND_SECRET_KEY = 3
KIND_CIPHERTEXT = 4
KIND_SEALED = 5

SIZES: dict[type, int] = {pymcl.Fr: 32, pymcl.G1: 48, pymcl.G2: 96, pymcl.GT: 576}

_E = TypeVar("_E", pymcl.Fr, pymcl.G1, pymcl.G2, pymcl.GT)


class Writer:
    """Accumulates the fields of one structure."""

    def __init__(self, kind: int) -> None:
        self._parts: list[bytes] = [MAGIC, bytes((VERSION, kind))]

    def element(self, value: pymcl.Fr | pymcl.G1 | pymcl.G2 | pymcl.GT) -> None:
        """Append a group element or scalar (fixed size)."""
        raw = value.serialize()
        assert len(raw) == SIZES[type(value)]
        self._parts.append(raw)

    def blob(self, data: bytes) -> None:
        """Append length-prefixed bytes."""
        self._parts.append(struct.pack(">I", len(data)))
        self._parts.append(data)

    def u16(self, value: int) -> None:
        """Append an unsigned 16-bit integer."""
        self._parts.append(struct.pack(">H", value))

    def u8(self, value: int) -> None:
        """Append one byte."""
        self._parts.append(bytes((value,)))

    def getvalue(self) -> bytes:
        """The encoded structure."""
        return b"".join(self._parts)


class Reader:
    """Strict reader over one encoded structure."""

    def __init__(self, data: bytes, kind: int, structure: str) -> None:
        if not isinstance(data, bytes | bytearray | memoryview):
            raise MalformedError(
                structure, f"expected bytes, got {type(data).__name__}"
            )
        self._data = bytes(data)
        self._pos = 0
        self.structure = structure
        header = self._take(len(MAGIC) + 2, "header")
        if header[: len(MAGIC)] != MAGIC:
            raise MalformedError(structure, "bad magic (not a trusted-cloud ABE blob)")
        if header[len(MAGIC)] != VERSION:
            raise MalformedError(structure, f"unsupported version {header[len(MAGIC)]}")
        if header[len(MAGIC) + 1] != kind:
            raise MalformedError(
                structure, f"wrong kind {header[len(MAGIC) + 1]} (expected {kind})"
            )

    def _take(self, n: int, what: str) -> bytes:
        if n > len(self._data) - self._pos:
            raise MalformedError(
                self.structure,
                f"truncated at offset {self._pos} reading {what} ({n} bytes)",
            )
        out = self._data[self._pos : self._pos + n]
        self._pos += n
        return out

    def element(self, cls: type[_E], what: str) -> _E:
        """Read a group element or scalar of type ``cls``."""
        raw = self._take(SIZES[cls], what)
        try:
            value: _E = cls.deserialize(raw)
        except (ValueError, RuntimeError):
            raise MalformedError(
                self.structure, f"{what} is not a valid {cls.__name__} element"
            )
        if value.serialize() != raw:
            raise MalformedError(self.structure, f"{what} is not canonically encoded")
        return value

    def blob(self, what: str, limit: int = 1 << 30) -> bytes:
        """Read length-prefixed bytes (at most ``limit``)."""
        (n,) = struct.unpack(">I", self._take(4, f"length of {what}"))
        if n > limit:
            raise MalformedError(self.structure, f"{what} too long ({n} bytes)")
        return self._take(n, what)

    def u16(self, what: str) -> int:
        """Read an unsigned 16-bit integer."""
        value: int = struct.unpack(">H", self._take(2, what))[0]
        return value

    def u8(self, what: str) -> int:
        """Read one byte."""
        return self._take(1, what)[0]

    def end(self) -> None:
        """Check that every byte was consumed."""
        if self._pos != len(self._data):
            raise MalformedError(
                self.structure,
                f"{len(self._data) - self._pos} trailing bytes at offset {self._pos}",
            )
