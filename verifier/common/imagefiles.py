"""The regular files of a root file system and their digests, from a
directory (a mounted image, a chroot) or a tar archive of it (what
``disk-image-create -t tar`` writes), and of its initramfs (the kernel
measures the files the initramfs's ``/init`` runs and reads, before the
root file system is mounted): the input of runtime policies built
from an image (``trusted-tenant policy generate runtime``,
``trusted-ima-policy from-tree``).

Paths are absolute inside the image. Symbolic links are left out (IMA
logs the path of the file opened, with links resolved); a hard link is
listed under each of its names.
"""

from __future__ import annotations

import hashlib
import io
import lzma
import os
import stat
import tarfile
import zlib
from collections.abc import Iterator, Sequence
from typing import IO

from verifier.common.errors import CommonError

__all__ = ["Digests", "ImageFilesError", "cpio_files", "tar_files", "tree_files"]

_CHUNK = 1 << 20
#: (algorithm, digest) pairs of one file.
Digests = set[tuple[str, bytes]]


class ImageFilesError(CommonError):
    """The image's root directory or archive cannot be read."""


def _digests(stream: IO[bytes], algorithms: Sequence[str]) -> Digests:
    hashers = [hashlib.new(a) for a in algorithms]
    while chunk := stream.read(_CHUNK):
        for h in hashers:
            h.update(chunk)
    return {(a, h.digest()) for a, h in zip(algorithms, hashers, strict=True)}


def _inside(name: str) -> str:
    """An archive member's name as an absolute path inside the image."""
    while name.startswith("./"):
        name = name[2:]
    return os.path.normpath("/" + name)


def tree_files(
    root: str, algorithms: Sequence[str] = ("sha256",)
) -> Iterator[tuple[str, Digests]]:
    """(path inside the image, digests) of every regular file under ``root``.

    Raises:
        ImageFilesError: ``root`` is not a directory.
    """
    if not os.path.isdir(root):
        raise ImageFilesError(f"{root} is not a directory")
    for directory, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            full = os.path.join(directory, name)
            if os.path.islink(full) or not os.path.isfile(full):
                continue
            with open(full, "rb") as stream:
                yield "/" + os.path.relpath(full, root), _digests(stream, algorithms)


def tar_files(
    path: str, algorithms: Sequence[str] = ("sha256",)
) -> Iterator[tuple[str, Digests]]:
    """(path inside the image, digests) of every regular file in a tar
    archive of a root file system (compressed or not).

    Raises:
        ImageFilesError: not a readable tar archive.
    """
    seen: dict[str, Digests] = {}
    try:
        with tarfile.open(path, "r:*") as archive:
            for member in archive:
                name = _inside(member.name)
                if member.isfile():
                    stream = archive.extractfile(member)
                    if stream is None:
                        continue
                    seen[name] = _digests(stream, algorithms)
                    yield name, seen[name]
                elif member.islnk():
                    target = _inside(member.linkname)
                    if target in seen:
                        yield name, seen[target]
    except (OSError, tarfile.TarError) as exc:
        raise ImageFilesError(f"{path}: not a readable tar archive: {exc}") from exc


_NEWC = (b"070701", b"070702")
_NEWC_HEADER = 110
_TRAILER = "TRAILER!!!"


def _align4(offset: int) -> int:
    return (offset + 3) & ~3


def _decompress(data: bytes) -> tuple[bytes, bytes]:
    """(the first compressed stream of ``data`` decompressed, what follows)."""
    if data[:2] == b"\x1f\x8b":
        inflater = zlib.decompressobj(zlib.MAX_WBITS | 16)
        return inflater.decompress(data), inflater.unused_data
    if data[:6] == b"\xfd7zXZ\x00" or data[:1] == b"\x5d":
        unpacker = lzma.LZMADecompressor()
        return unpacker.decompress(data), unpacker.unused_data
    if data[:4] == b"\x28\xb5\x2f\xfd":
        raise ImageFilesError(
            "a zstd-compressed initramfs: decompress it first (unzstd)"
        )
    raise ImageFilesError(f"not a cpio archive nor gzip or xz: {data[:6]!r}")


def _newc(
    data: bytes, offset: int, algorithms: Sequence[str]
) -> Iterator[tuple[str, Digests] | int]:
    """The regular files of one newc cpio archive at ``offset``, then the
    offset after its trailer."""
    waiting: dict[int, list[str]] = {}  # hard links before their data
    while True:
        head = data[offset : offset + _NEWC_HEADER]
        if len(head) < _NEWC_HEADER or head[:6] not in _NEWC:
            raise ImageFilesError(f"bad cpio header at byte {offset}")
        try:
            fields = [int(head[6 + 8 * i : 14 + 8 * i], 16) for i in range(13)]
        except ValueError as exc:
            raise ImageFilesError(f"bad cpio header at byte {offset}") from exc
        ino, mode, nlink, size, namesize = (
            fields[0], fields[1], fields[4], fields[6], fields[11]
        )  # fmt: skip
        name_at = offset + _NEWC_HEADER
        name = data[name_at : name_at + namesize - 1].decode("utf-8", "surrogateescape")
        start = _align4(name_at + namesize)
        offset = _align4(start + size)
        if offset > len(data):
            raise ImageFilesError(f"cpio member {name!r} is truncated")
        if name == _TRAILER:
            yield offset
            return
        if not stat.S_ISREG(mode):
            continue
        path = _inside(name)
        if size == 0 and nlink > 1:
            waiting.setdefault(ino, []).append(path)
            continue
        digests = _digests(io.BytesIO(data[start : start + size]), algorithms)
        for each in (*waiting.pop(ino, []), path):
            yield each, digests


def cpio_files(
    path: str, algorithms: Sequence[str] = ("sha256",)
) -> Iterator[tuple[str, Digests]]:
    """(path, digests) of every regular file of an initramfs: newc cpio
    archives, each uncompressed or gzip/xz/lzma compressed, one after the
    other (an early microcode archive, then the main one).

    Raises:
        ImageFilesError: unreadable, not such archives, or zstd-compressed.
    """
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        raise ImageFilesError(f"{path}: {exc}") from exc
    offset = 0
    try:
        while True:
            while data[offset : offset + 4] == b"\0\0\0\0":  # padding
                offset += 4
            if offset >= len(data):
                return
            if data[offset : offset + 6] not in _NEWC:
                data, offset = b"".join(_decompress(data[offset:])), 0
                continue
            for item in _newc(data, offset, algorithms):
                if isinstance(item, int):
                    offset = item
                else:
                    yield item
    except (zlib.error, lzma.LZMAError, EOFError) as exc:
        raise ImageFilesError(f"{path}: a corrupt compressed archive: {exc}") from exc
