"""FAT12, FAT16 and FAT32 (Microsoft's "FAT: General Overview of On-Disk
Format", with VFAT long names), read only: an EFI system partition's
files by path, case-insensitively.

Every cluster chain is bounded by the number of clusters of the volume;
directory and file sizes are checked against it. Any defect raises
:class:`~verifier.common.diskimage.DiskImageError`.
"""

from __future__ import annotations

import dataclasses
import struct

from verifier.common.diskimage import Disk, DiskImageError, MissingFileError

__all__ = ["FatFileSystem"]

_DIR_ENTRY = 32
_ATTR_DIR, _ATTR_VOLUME, _ATTR_LFN = 0x10, 0x08, 0x0F
_MAX_FILE = 1 << 30
_MAX_DIR = 1 << 21


@dataclasses.dataclass(frozen=True, slots=True)
class _Entry:
    name: str
    short: str
    is_dir: bool
    cluster: int
    size: int


class FatFileSystem:
    """A FAT volume.

    Attributes:
        serial: the volume serial number as GRUB shows it (``XXXX-XXXX``).
        label: the volume label of the boot sector (spaces stripped).
    """

    def __init__(self, disk: Disk) -> None:
        if disk.size < 512:
            raise DiskImageError("FAT: volume smaller than a boot sector")
        boot = disk.read(0, 512)
        if boot[510:512] != b"\x55\xaa":
            raise DiskImageError("FAT: no boot sector signature")
        sector, per_cluster, reserved, fats, roots, total16 = struct.unpack_from(
            "<HBHBHH", boot, 11
        )
        (fat16,) = struct.unpack_from("<H", boot, 22)
        total32, fat32, root_cluster = struct.unpack_from("<I I 4x I", boot, 32)
        if sector not in (512, 1024, 2048, 4096) or per_cluster not in (
            1, 2, 4, 8, 16, 32, 64, 128,
        ):  # fmt: skip
            raise DiskImageError(
                f"FAT: sector size {sector} / cluster {per_cluster} not valid"
            )
        fat_sectors = fat16 or fat32
        total = total16 or total32
        if not fats or not reserved or not fat_sectors:
            raise DiskImageError("FAT: no FAT (BPB_NumFATs, BPB_FATSz or reserved 0)")
        root_sectors = -(-roots * _DIR_ENTRY // sector)
        data_start = reserved + fats * fat_sectors + root_sectors
        if total * sector > disk.size or data_start >= total:
            raise DiskImageError(f"FAT: {total} sectors do not fit the partition")
        self._disk, self._sector = disk, sector
        self._cluster = sector * per_cluster
        self._count = (total - data_start) // per_cluster
        self._bits = 12 if self._count < 4085 else 16 if self._count < 65525 else 32
        self._fat_at = reserved * sector
        self._fat_size = fat_sectors * sector
        need = ((self._count + 2) * self._bits + 7) // 8
        if need > self._fat_size:
            raise DiskImageError(f"FAT: the FAT is short of {self._count} clusters")
        self._fat = disk.read(self._fat_at, need) + b"\0\0\0\0"
        self._data_at = data_start * sector
        self._root_at = (reserved + fats * fat_sectors) * sector
        self._root_size = roots * _DIR_ENTRY
        self._root_cluster = root_cluster if self._bits == 32 else 0
        label_at = 67 if self._bits == 32 else 39
        (serial,) = struct.unpack_from("<I", boot, label_at)
        self.serial = f"{serial >> 16:04X}-{serial & 0xFFFF:04X}"
        self.label = boot[label_at + 4 : label_at + 15].decode("latin-1").strip()

    def _next(self, cluster: int) -> int:
        if self._bits == 32:
            return int(struct.unpack_from("<I", self._fat, cluster * 4)[0]) & 0x0FFFFFFF
        if self._bits == 16:
            return int(struct.unpack_from("<H", self._fat, cluster * 2)[0])
        (pair,) = struct.unpack_from("<H", self._fat, cluster * 3 // 2)
        return int(pair >> 4 if cluster & 1 else pair & 0xFFF)

    def _chain(self, first: int, limit: int) -> bytes:
        """Up to ``limit`` bytes of the chain from ``first``."""
        end = {12: 0xFF8, 16: 0xFFF8, 32: 0x0FFFFFF8}[self._bits]
        out = bytearray()
        cluster, hops = first, 0
        while len(out) < limit:
            if not 2 <= cluster < self._count + 2:
                raise DiskImageError(f"FAT: cluster {cluster} outside the volume")
            hops += 1
            if hops > self._count:
                raise DiskImageError("FAT: a cluster chain loops")
            out += self._disk.read(
                self._data_at + (cluster - 2) * self._cluster, self._cluster
            )
            cluster = self._next(cluster)
            if cluster >= end:
                break
        if len(out) < limit:
            raise DiskImageError(f"FAT: chain from {first} shorter than {limit} bytes")
        return bytes(out[:limit])

    def _directory(self, entry: _Entry | None) -> list[_Entry]:
        if entry is None and not self._root_cluster:
            raw = self._disk.read(self._root_at, self._root_size)
        else:
            first = self._root_cluster if entry is None else entry.cluster
            raw = self._dir_chain(first)
        return list(_entries(raw))

    def _dir_chain(self, first: int) -> bytes:
        end = {12: 0xFF8, 16: 0xFFF8, 32: 0x0FFFFFF8}[self._bits]
        out = bytearray()
        cluster, hops = first, 0
        while True:
            if not 2 <= cluster < self._count + 2:
                raise DiskImageError(f"FAT: directory cluster {cluster} is invalid")
            hops += 1
            if hops > self._count or len(out) >= _MAX_DIR:
                raise DiskImageError("FAT: a directory's cluster chain loops")
            out += self._disk.read(
                self._data_at + (cluster - 2) * self._cluster, self._cluster
            )
            cluster = self._next(cluster)
            if cluster >= end:
                return bytes(out)

    def _lookup(self, path: str) -> _Entry | None:
        entry: _Entry | None = None
        for part in [p for p in path.split("/") if p]:
            if entry is not None and not entry.is_dir:
                raise DiskImageError(f"FAT: {path}: a file is not a directory")
            wanted = part.casefold()
            found = [
                e
                for e in self._directory(entry)
                if wanted in (e.name.casefold(), e.short.casefold())
            ]
            if not found:
                raise MissingFileError(path)
            entry = found[0]
        return entry

    def exists(self, path: str) -> bool:
        """Whether ``path`` names a file or directory."""
        try:
            self._lookup(path)
        except MissingFileError:
            return False
        return True

    def read_file(self, path: str) -> bytes:
        """The contents of the file at ``path`` (``/``-separated).

        Raises:
            MissingFileError: no such file.
            DiskImageError: a directory, or a damaged volume.
        """
        entry = self._lookup(path)
        if entry is None or entry.is_dir:
            raise DiskImageError(f"FAT: {path} is a directory")
        if entry.size > min(_MAX_FILE, self._count * self._cluster):
            raise DiskImageError(f"FAT: {path}: size {entry.size} exceeds the volume")
        if not entry.size:
            return b""
        return self._chain(entry.cluster, entry.size)


def _entries(raw: bytes) -> list[_Entry]:
    out = []
    long_parts: dict[int, str] = {}
    for at in range(0, len(raw) - _DIR_ENTRY + 1, _DIR_ENTRY):
        item = raw[at : at + _DIR_ENTRY]
        if item[0] == 0:
            break
        if item[0] == 0xE5:
            long_parts = {}
            continue
        attr = item[11]
        if attr & 0x3F == _ATTR_LFN:
            chars = item[1:11] + item[14:26] + item[28:32]
            text = chars.decode("utf-16-le", "replace").split("\0", 1)[0]
            long_parts[item[0] & 0x1F] = text.rstrip("\uffff")
            continue
        if attr & _ATTR_VOLUME:
            long_parts = {}
            continue
        base = item[0:8].decode("latin-1").rstrip()
        ext = item[8:11].decode("latin-1").rstrip()
        if base and base[0] == "\x05":
            base = "\xe5" + base[1:]
        short = base + ("." + ext if ext else "")
        name = "".join(long_parts[k] for k in sorted(long_parts)) or short
        long_parts = {}
        if short in (".", ".."):
            continue
        hi, lo, size = struct.unpack_from("<H4xHI", item, 20)
        out.append(_Entry(name, short, bool(attr & _ATTR_DIR), hi << 16 | lo, size))
    return out
