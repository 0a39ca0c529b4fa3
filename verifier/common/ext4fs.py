"""ext2/3/4 read only (the kernel's ``Documentation/filesystems/ext4/``):
the superblock, 32- and 64-bit group descriptors, inodes, extent trees and
the old indirect block map, directories scanned linearly (which also reads
htree directories: their index blocks look like empty entries), fast and
slow symbolic links -- enough for ``/boot/grub/grub.cfg``, the kernels and
initrds of a root or ``/boot`` file system.

Inline data, encrypted inodes and ``meta_bg`` are refused. Every block
number is checked against the file system, every tree walk and link
chain bounded. Any defect raises
:class:`~verifier.common.diskimage.DiskImageError`.
"""

from __future__ import annotations

import struct
import uuid

from verifier.common.diskimage import Disk, DiskImageError, MissingFileError

__all__ = ["Ext4FileSystem"]

_MAGIC = 0xEF53
_INCOMPAT_META_BG, _INCOMPAT_64BIT = 0x10, 0x80
_EXTENTS_FL, _INLINE_FL, _ENCRYPT_FL = 0x80000, 0x10000000, 0x800
_S_IFMT, _S_IFDIR, _S_IFREG, _S_IFLNK = 0xF000, 0x4000, 0x8000, 0xA000
_EXTENT_MAGIC = 0xF30A
_MAX_DEPTH = 5
_MAX_LINKS = 40
_MAX_FILE = 1 << 30
_MAX_DIR = 1 << 24
_MAX_NODES = 4096


class Ext4FileSystem:
    """An ext2/3/4 file system.

    Attributes:
        uuid: its UUID as GRUB compares it (lower case, with dashes).
        label: its volume label.
    """

    def __init__(self, disk: Disk) -> None:
        if disk.size < 2048:
            raise DiskImageError("ext4: partition smaller than a superblock")
        sb = disk.read(1024, 1024)
        (magic,) = struct.unpack_from("<H", sb, 56)
        if magic != _MAGIC:
            raise DiskImageError("ext4: no superblock (magic 0xEF53)")
        inodes, blocks_lo = struct.unpack_from("<II", sb, 0)
        first_data, log_block = struct.unpack_from("<II", sb, 20)
        per_group, _, inodes_per_group = struct.unpack_from("<III", sb, 32)
        (rev,) = struct.unpack_from("<I", sb, 76)
        (inode_size,) = struct.unpack_from("<H", sb, 88)
        (incompat,) = struct.unpack_from("<I", sb, 96)
        (desc_size,) = struct.unpack_from("<H", sb, 254)
        (blocks_hi,) = struct.unpack_from("<I", sb, 336)
        if log_block > 6:
            raise DiskImageError(f"ext4: s_log_block_size {log_block} over 6")
        self._block = 1024 << log_block
        self._64 = bool(incompat & _INCOMPAT_64BIT)
        self._blocks = blocks_lo | (blocks_hi << 32 if self._64 else 0)
        if self._blocks * self._block > disk.size or not self._blocks:
            raise DiskImageError(f"ext4: {self._blocks} blocks exceed the partition")
        if incompat & _INCOMPAT_META_BG:
            raise DiskImageError("ext4: not supported: meta_bg")
        self._inode_size = 128 if rev == 0 else inode_size
        if self._inode_size < 128 or self._inode_size > self._block:
            raise DiskImageError(f"ext4: inode size {self._inode_size} not valid")
        self._desc = desc_size if self._64 else 32
        if self._desc < 32 or self._desc > 1024:
            raise DiskImageError(f"ext4: group descriptor size {self._desc} not valid")
        if (
            not per_group
            or not inodes_per_group
            or inodes > inodes_per_group * (-(-self._blocks // per_group))
        ):
            raise DiskImageError("ext4: group sizes do not fit the superblock")
        self._disk = disk
        self._inodes = inodes
        self._inodes_per_group = inodes_per_group
        self._gdt = (first_data + 1) * self._block
        self._groups = -(-(self._blocks - first_data) // per_group)
        self.uuid = str(uuid.UUID(bytes=sb[104:120]))
        self.label = sb[120:136].split(b"\0", 1)[0].decode("utf-8", "replace")

    # -- blocks and inodes --------------------------------------------------

    def _read_blocks(self, number: int, count: int = 1) -> bytes:
        if number + count > self._blocks or number < 0:
            raise DiskImageError(f"ext4: block {number} outside the file system")
        return self._disk.read(number * self._block, count * self._block)

    def _inode(self, number: int) -> bytes:
        if not 1 <= number <= self._inodes:
            raise DiskImageError(f"ext4: inode {number} outside the file system")
        group, index = divmod(number - 1, self._inodes_per_group)
        desc = self._disk.read(self._gdt + group * self._desc, self._desc)
        (table,) = struct.unpack_from("<I", desc, 8)
        if self._64 and self._desc >= 64:
            table |= struct.unpack_from("<I", desc, 40)[0] << 32
        offset = table * self._block + index * self._inode_size
        if table >= self._blocks or offset + self._inode_size > self._disk.size:
            raise DiskImageError(f"ext4: inode table of group {group} is outside")
        return self._disk.read(offset, self._inode_size)

    def _data(self, inode: bytes, what: str) -> bytes:
        """The whole contents of a regular file, directory or slow link."""
        flags, = struct.unpack_from("<I", inode, 32)  # fmt: skip
        size = struct.unpack_from("<I", inode, 4)[0] | (
            struct.unpack_from("<I", inode, 108)[0] << 32
        )
        if flags & _INLINE_FL or flags & _ENCRYPT_FL:
            raise DiskImageError(f"ext4: {what}: inline or encrypted data unsupported")
        if size > min(_MAX_FILE, self._blocks * self._block):
            raise DiskImageError(f"ext4: {what}: size {size} exceeds the file system")
        nblocks = -(-size // self._block)
        out = bytearray(nblocks * self._block)
        if flags & _EXTENTS_FL:
            budget = [_MAX_NODES + nblocks]
            self._extents(inode[40:100], out, (nblocks, budget), 0, what)
        else:
            self._block_map(inode[40:100], out, nblocks, what)
        return bytes(out[:size])

    def _put(self, out: bytearray, logical: int, physical: int, count: int) -> None:
        data = self._read_blocks(physical, count)
        out[logical * self._block : (logical + count) * self._block] = data

    def _extents(
        self,
        node: bytes,
        out: bytearray,
        limits: tuple[int, list[int]],
        depth: int,
        what: str,
    ) -> None:
        nblocks, budget = limits
        budget[0] -= 1
        magic, entries, _, level = struct.unpack_from("<HHHH", node, 0)
        if magic != _EXTENT_MAGIC or depth > _MAX_DEPTH or level > _MAX_DEPTH:
            raise DiskImageError(f"ext4: {what}: bad extent node")
        if budget[0] < 0:
            raise DiskImageError(f"ext4: {what}: extent tree too large")
        if 12 + 12 * entries > len(node):
            raise DiskImageError(f"ext4: {what}: {entries} extents overflow the node")
        for i in range(entries):
            at = 12 + 12 * i
            if level:
                _, lo, hi = struct.unpack_from("<IIH", node, at)
                child = self._read_blocks(lo | hi << 32)
                self._extents(child, out, limits, depth + 1, what)
                continue
            logical, length, hi, lo = struct.unpack_from("<IHHI", node, at)
            if length > 32768:
                continue  # uninitialized: reads as zeros
            count = min(length, max(0, nblocks - logical))
            if count:
                self._put(out, logical, lo | hi << 32, count)

    def _block_map(self, raw: bytes, out: bytearray, nblocks: int, what: str) -> None:
        pointers = struct.unpack("<15I", raw)
        per = self._block // 4
        todo = [(p, 0, i) for i, p in enumerate(pointers[:12])]
        start = 12
        for level, pointer in enumerate(pointers[12:], 1):
            todo.append((pointer, level, start))
            start += per**level
        while todo:
            pointer, level, logical = todo.pop()
            if not pointer or logical >= nblocks:
                continue
            if not level:
                self._put(out, logical, pointer, 1)
                continue
            children = struct.unpack(f"<{per}I", self._read_blocks(pointer))
            step = per ** (level - 1)
            todo += [(c, level - 1, logical + i * step) for i, c in enumerate(children)]

    # -- paths --------------------------------------------------------------

    def _find(self, directory: bytes, name: str, what: str) -> int | None:
        data = self._data(directory, what)
        if len(data) > _MAX_DIR:
            raise DiskImageError(f"ext4: {what}: directory too large")
        at, wanted = 0, name.encode("utf-8", "surrogateescape")
        while at + 8 <= len(data):
            number, rec_len, name_len = struct.unpack_from("<IHB", data, at)
            if rec_len < 8 or at + rec_len > len(data) or 8 + name_len > rec_len:
                raise DiskImageError(f"ext4: {what}: bad directory entry at {at}")
            if number and data[at + 8 : at + 8 + name_len] == wanted:
                return int(number)
            at += rec_len
        return None

    def _resolve(self, path: str) -> bytes:
        parts = [p for p in path.split("/") if p]
        inode, stack, links = self._inode(2), [self._inode(2)], 0
        while parts:
            part = parts.pop(0)
            if part == ".":
                continue
            if part == "..":
                if len(stack) > 1:
                    stack.pop()
                inode = stack[-1]
                continue
            if _mode(inode) != _S_IFDIR:
                raise DiskImageError(f"ext4: {path}: not a directory on the way")
            number = self._find(inode, part, path)
            if number is None:
                raise MissingFileError(path)
            child = self._inode(number)
            if _mode(child) == _S_IFLNK:
                links += 1
                if links > _MAX_LINKS:
                    raise DiskImageError(f"ext4: {path}: too many symbolic links")
                target = self._link(child, path)
                if target.startswith("/"):
                    stack = [self._inode(2)]
                parts = [p for p in target.split("/") if p] + parts
                inode = stack[-1]
                continue
            stack.append(child)
            inode = child
        return inode

    def _link(self, inode: bytes, what: str) -> str:
        (size,) = struct.unpack_from("<I", inode, 4)
        (flags,) = struct.unpack_from("<I", inode, 32)
        if size < 60 and not flags & (_EXTENTS_FL | _INLINE_FL):
            raw = inode[40 : 40 + size]
        else:
            raw = self._data(inode, what)
        if not raw or len(raw) > 4096:
            raise DiskImageError(f"ext4: {what}: bad symbolic link")
        return raw.decode("utf-8", "surrogateescape")

    def exists(self, path: str) -> bool:
        """Whether ``path`` names a file, directory or working link."""
        try:
            self._resolve(path)
        except MissingFileError:
            return False
        return True

    def read_file(self, path: str) -> bytes:
        """The contents of the regular file at ``path``, links followed.

        Raises:
            MissingFileError: no such file.
            DiskImageError: not a regular file, or a damaged file system.
        """
        inode = self._resolve(path)
        if _mode(inode) != _S_IFREG:
            raise DiskImageError(f"ext4: {path} is not a regular file")
        return self._data(inode, path)


def _mode(inode: bytes) -> int:
    return int(struct.unpack_from("<H", inode, 0)[0]) & _S_IFMT
