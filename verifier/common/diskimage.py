"""Whole-disk images read in pure Python (no mount, no loop device, no
qemu-img): the raw or qcow2 container and its GPT partition table, for
``trusted-tenant policy generate measured-boot --image`` (the tenant's
laptop has the client role only).

* qcow2 (qemu's ``docs/interop/qcow2.txt``), versions 2 and 3: the L1 and
  L2 tables, zero and unallocated clusters (read as zeros) and
  deflate-compressed clusters (cloud images are compressed). Backing
  files, encryption, an external data file, extended L2 entries and zstd
  compression are refused, naming the feature.
* GPT (UEFI specification 2.10, section 5.3): the protective MBR, the
  header at LBA 1 (512- or 4096-byte sectors) and the partition entries.

Every size and offset read from the image is checked against the image
before it is used; every loop is bounded by the image's size. Any
defect raises :class:`DiskImageError` naming the structure and field.
File systems: :mod:`verifier.common.fatfs`, :mod:`verifier.common.ext4fs`.
"""

from __future__ import annotations

import dataclasses
import struct
import uuid
import zlib
from typing import BinaryIO, Protocol

from verifier.common.errors import CommonError

__all__ = [
    "ESP_TYPE",
    "BytesImage",
    "Disk",
    "DiskImageError",
    "FileImage",
    "MissingFileError",
    "Partition",
    "Qcow2Image",
    "Slice",
    "gpt_partitions",
    "open_disk",
]

#: The EFI system partition's type GUID.
ESP_TYPE = uuid.UUID("c12a7328-f81f-11d2-ba4b-00a0c93ec93b")
_MAX_PARTITIONS = 1024
_QCOW_MAGIC = b"QFI\xfb"
_QCOW_HEADER = struct.Struct(">4sIQIIQIIQQIIQ")
_QCOW_V3 = struct.Struct(">QQQII")
_QCOW_INCOMPAT = {
    1 << 1: "the image is marked corrupt",
    1 << 2: "an external data file",
    1 << 4: "extended L2 entries",
}
_QCOW_DIRTY, _QCOW_COMPRESSION_TYPE = 1 << 0, 1 << 3
_L2_OFFSET = 0x00FFFFFFFFFFFE00
_COMPRESSED, _ZERO = 1 << 62, 1
_CACHE = 64


class DiskImageError(CommonError):
    """A disk image, a file system in it, its GRUB configuration or an
    OVMF variable store cannot be read (or uses what is not supported)."""


class MissingFileError(DiskImageError):
    """No such file (or device) in the image.

    Attributes:
        path: the path looked up.
    """

    def __init__(self, path: str) -> None:
        super().__init__(f"{path}: no such file")
        self.path = path


class Disk(Protocol):
    """Bytes addressable by offset: an image, or a partition of one."""

    size: int

    def read(self, offset: int, length: int) -> bytes:
        """Exactly ``length`` bytes at ``offset``.

        Raises:
            DiskImageError: outside the disk, or unreadable.
        """


def _check_range(size: int, offset: int, length: int, what: str) -> None:
    if offset < 0 or length < 0 or offset + length > size:
        raise DiskImageError(
            f"{what}: {length} bytes at offset {offset} are beyond its end ({size})"
        )


class BytesImage:
    """A raw image held in memory (tests, fuzzing)."""

    def __init__(self, data: bytes | bytearray) -> None:
        self._data = data
        self.size = len(data)

    def read(self, offset: int, length: int) -> bytes:
        _check_range(self.size, offset, length, "image")
        return bytes(self._data[offset : offset + length])


class FileImage:
    """A raw image file (or the bytes of a qcow2 file)."""

    def __init__(self, handle: BinaryIO) -> None:
        self._handle = handle
        self.size = handle.seek(0, 2)

    def read(self, offset: int, length: int) -> bytes:
        _check_range(self.size, offset, length, "image")
        try:
            self._handle.seek(offset)
            data = self._handle.read(length)
        except OSError as exc:
            raise DiskImageError(f"image: cannot read: {exc}") from None
        if len(data) != length:
            raise DiskImageError(f"image: short read at offset {offset}")
        return data


class Slice:
    """A partition: ``size`` bytes of ``disk`` from ``start``."""

    def __init__(self, disk: Disk, start: int, size: int, what: str) -> None:
        _check_range(disk.size, start, size, what)
        self._disk, self._start, self.size, self._what = disk, start, size, what

    def read(self, offset: int, length: int) -> bytes:
        _check_range(self.size, offset, length, self._what)
        return self._disk.read(self._start + offset, length)


class Qcow2Image:
    """The guest-visible bytes of a qcow2 file (``file`` is its raw bytes)."""

    def __init__(self, file: Disk) -> None:
        self._file = file
        if file.size < _QCOW_HEADER.size:
            raise DiskImageError("qcow2: header truncated")
        (
            magic, version, backing, _, cluster_bits, size, crypt,
            l1_size, l1_offset, _, _, _, _,
        ) = _QCOW_HEADER.unpack(file.read(0, _QCOW_HEADER.size))  # fmt: skip
        if magic != _QCOW_MAGIC or version not in (2, 3):
            raise DiskImageError(f"qcow2: version {version} is not 2 or 3")
        if backing:
            raise DiskImageError(
                "qcow2: the image has a backing file (flatten it: qemu-img convert)"
            )
        if crypt:
            raise DiskImageError("qcow2: the image is encrypted")
        if not 9 <= cluster_bits <= 21:
            raise DiskImageError(f"qcow2: cluster_bits {cluster_bits} not in 9..21")
        if version == 3:
            self._v3_features(file)
        self.size = size
        self._bits = cluster_bits
        self._cluster = 1 << cluster_bits
        self._l2_bits = cluster_bits - 3
        per_l1 = self._cluster << self._l2_bits
        if l1_size < -(-size // per_l1) or l1_size > (32 << 20) // 8:
            raise DiskImageError(f"qcow2: l1_size {l1_size} does not fit size {size}")
        _check_range(file.size, l1_offset, 8 * l1_size, "qcow2 L1 table")
        self._l1 = struct.unpack(f">{l1_size}Q", file.read(l1_offset, 8 * l1_size))
        self._l2: dict[int, tuple[int, ...]] = {}
        self._clusters: dict[int, bytes] = {}

    def _v3_features(self, file: Disk) -> None:
        if file.size < _QCOW_HEADER.size + _QCOW_V3.size:
            raise DiskImageError("qcow2: version 3 header truncated")
        incompat, _, _, refcount_order, header_length = _QCOW_V3.unpack(
            file.read(_QCOW_HEADER.size, _QCOW_V3.size)
        )
        for bit, what in _QCOW_INCOMPAT.items():
            if incompat & bit:
                raise DiskImageError(f"qcow2: not supported: {what}")
        if incompat & _QCOW_COMPRESSION_TYPE:
            if header_length < 105 or file.size < 105:
                raise DiskImageError("qcow2: compression type missing from header")
            kind = file.read(104, 1)[0]
            if kind != 0:
                name = "zstd" if kind == 1 else f"type {kind}"
                raise DiskImageError(f"qcow2: not supported: {name} compression")
        known = _QCOW_DIRTY | _QCOW_COMPRESSION_TYPE
        if incompat & ~known:
            raise DiskImageError(
                f"qcow2: unknown incompatible features {incompat & ~known:#x}"
            )
        if refcount_order > 6:
            raise DiskImageError(f"qcow2: refcount_order {refcount_order} over 6")

    def _l2_table(self, index: int) -> tuple[int, ...] | None:
        entry = self._l1[index] & _L2_OFFSET
        if not entry:
            return None
        table = self._l2.get(index)
        if table is None:
            if entry % self._cluster:
                raise DiskImageError(f"qcow2: L2 table {index} is not cluster aligned")
            raw = self._file.read(entry, self._cluster)
            table = struct.unpack(f">{self._cluster // 8}Q", raw)
            if len(self._l2) >= _CACHE:
                self._l2.clear()
            self._l2[index] = table
        return table

    def _read_cluster(self, number: int) -> bytes:
        cached = self._clusters.get(number)
        if cached is not None:
            return cached
        table = self._l2_table(number >> self._l2_bits)
        entry = 0 if table is None else table[number & ((1 << self._l2_bits) - 1)]
        if entry & _COMPRESSED:
            data = self._compressed(entry & ~(3 << 62))
        elif not entry & _L2_OFFSET or entry & _ZERO:
            data = bytes(self._cluster)
        else:
            host = entry & _L2_OFFSET
            if host % self._cluster:
                raise DiskImageError(f"qcow2: cluster {number} is not aligned")
            data = self._file.read(host, self._cluster)
        if len(self._clusters) >= _CACHE:
            self._clusters.clear()
        self._clusters[number] = data
        return data

    def _compressed(self, entry: int) -> bytes:
        shift = 62 - (self._bits - 8)
        host = entry & ((1 << shift) - 1)
        sectors = (entry >> shift) + 1
        length = min(sectors * 512 - (host & 511), self._file.size - host)
        if host >= self._file.size or length <= 0:
            raise DiskImageError(f"qcow2: compressed cluster at {host} is beyond EOF")
        inflate = zlib.decompressobj(-15)
        try:
            data = inflate.decompress(self._file.read(host, length), self._cluster)
        except zlib.error as exc:
            raise DiskImageError(f"qcow2: cluster at {host}: {exc}") from None
        if len(data) != self._cluster:
            raise DiskImageError(
                f"qcow2: compressed cluster at {host} inflates to {len(data)} bytes"
            )
        return data

    def read(self, offset: int, length: int) -> bytes:
        _check_range(self.size, offset, length, "qcow2 image")
        out = bytearray()
        while length > 0:
            number, within = divmod(offset, self._cluster)
            take = min(length, self._cluster - within)
            out += self._read_cluster(number)[within : within + take]
            offset += take
            length -= take
        return bytes(out)


def open_disk(file: Disk) -> Disk:
    """The guest-visible disk of an image file: qcow2 by its magic, else raw."""
    if file.size >= 4 and file.read(0, 4) == _QCOW_MAGIC:
        return Qcow2Image(file)
    return file


@dataclasses.dataclass(frozen=True, slots=True)
class Partition:
    """A GPT partition entry.

    Attributes:
        number: its 1-based position in the entry array (GRUB's ``gptN``).
        type_guid: the partition type.
        guid: the unique partition GUID.
        name: its UTF-16 name.
        disk: its bytes.
    """

    number: int
    type_guid: uuid.UUID
    guid: uuid.UUID
    name: str
    disk: Disk


def gpt_partitions(disk: Disk) -> list[Partition]:
    """The used entries of the disk's GPT (header at LBA 1).

    Raises:
        DiskImageError: no protective MBR, no GPT header, entries that do
            not fit the disk.
    """
    if disk.size < 1024 or disk.read(510, 2) != b"\x55\xaa":
        raise DiskImageError("not a partitioned disk image (no MBR signature)")
    if not any(disk.read(446 + 16 * i + 4, 1) == b"\xee" for i in range(4)):
        raise DiskImageError("no GPT: the MBR has no protective (0xEE) partition")
    for sector in (512, 4096):
        if disk.size >= 2 * sector and disk.read(sector, 8) == b"EFI PART":
            break
    else:
        raise DiskImageError("no GPT header (EFI PART) at LBA 1")
    header = disk.read(sector, 92)
    entries_lba, count, entry_size = struct.unpack_from("<QII", header, 72)
    if count > _MAX_PARTITIONS or not 128 <= entry_size <= 4096 or entry_size % 8:
        raise DiskImageError(
            f"GPT: {count} entries of {entry_size} bytes is not a partition array"
        )
    table = disk.read(entries_lba * sector, count * entry_size)
    out = []
    for i in range(count):
        raw = table[i * entry_size : i * entry_size + 128]
        type_guid = uuid.UUID(bytes_le=raw[:16])
        if type_guid.int == 0:
            continue
        first, last = struct.unpack_from("<QQ", raw, 32)
        if last < first:
            raise DiskImageError(f"GPT entry {i + 1}: last LBA {last} before {first}")
        name = raw[56:128].decode("utf-16-le", "replace").split("\0", 1)[0]
        start, size = first * sector, (last - first + 1) * sector
        part = Slice(disk, start, size, f"GPT partition {i + 1}")
        out.append(
            Partition(i + 1, type_guid, uuid.UUID(bytes_le=raw[16:32]), name, part)
        )
    return out
