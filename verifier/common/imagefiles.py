"""The regular files of a root file system and their digests, from a
directory (a mounted image, a chroot) or a tar archive of it (what
``disk-image-create -t tar`` writes): the input of runtime policies built
from an image (``trusted-tenant policy generate runtime``,
``trusted-ima-policy from-tree``).

Paths are absolute inside the image. Symbolic links are left out (IMA
logs the path of the file opened, with links resolved); a hard link is
listed under each of its names.
"""

from __future__ import annotations

import hashlib
import os
import tarfile
from collections.abc import Iterator, Sequence
from typing import IO

__all__ = ["Digests", "ImageFilesError", "tar_files", "tree_files"]

_CHUNK = 1 << 20
#: (algorithm, digest) pairs of one file.
Digests = set[tuple[str, bytes]]


class ImageFilesError(Exception):
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
