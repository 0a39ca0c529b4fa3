"""Big-endian TPM 2.0 marshalling primitives (TPM 2.0 Part 2, clause 5-10).

A :class:`Reader` walks a byte string and raises :class:`MalformedError`
naming the structure when the input is short or has trailing bytes; the
``put_*`` helpers build the same encodings.
"""

from __future__ import annotations

import struct

from verifier.protocol.errors import MalformedError

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")


class Reader:
    """Sequential reader over TPM-marshalled bytes.

    Args:
        data: the bytes to read.
        structure: the name used in error messages.
    """

    __slots__ = ("_data", "_pos", "structure")

    def __init__(self, data: bytes, structure: str) -> None:
        if not isinstance(data, bytes | bytearray | memoryview):
            raise MalformedError(structure, "expected bytes")
        self._data = bytes(data)
        self._pos = 0
        self.structure = structure

    def _take(self, n: int) -> int:
        pos = self._pos
        if pos + n > len(self._data):
            raise MalformedError(
                self.structure, f"truncated at offset {pos} (need {n} more bytes)"
            )
        self._pos = pos + n
        return pos

    def u8(self) -> int:
        return self._data[self._take(1)]

    def u16(self) -> int:
        return int(_U16.unpack_from(self._data, self._take(2))[0])

    def u32(self) -> int:
        return int(_U32.unpack_from(self._data, self._take(4))[0])

    def u64(self) -> int:
        return int(_U64.unpack_from(self._data, self._take(8))[0])

    def raw(self, n: int) -> bytes:
        pos = self._take(n)
        return self._data[pos : pos + n]

    def tpm2b(self, limit: int = 4096) -> bytes:
        """Read a TPM2B: a 16-bit size followed by that many bytes."""
        size = self.u16()
        if size > limit:
            raise MalformedError(self.structure, f"TPM2B of {size} bytes > {limit}")
        return self.raw(size)

    def end(self) -> None:
        """Require that every byte was consumed."""
        if self._pos != len(self._data):
            raise MalformedError(
                self.structure, f"{len(self._data) - self._pos} trailing bytes"
            )


def u16(value: int) -> bytes:
    return _U16.pack(value)


def u32(value: int) -> bytes:
    return _U32.pack(value)


def u64(value: int) -> bytes:
    return _U64.pack(value)


def tpm2b(value: bytes) -> bytes:
    """Encode ``value`` as a TPM2B (16-bit size prefix)."""
    return _U16.pack(len(value)) + value
