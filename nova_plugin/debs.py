"""Debian binary packages (``.deb``, deb(5)): what one installs, by digest.

A ``.deb`` is an ar archive of ``debian-binary`` (``2.0``), ``control.tar``
and ``data.tar`` (each uncompressed or gz, xz, zst, bz2 or lzma). The ar
container is read with python-debian (:mod:`debian.arfile`), the control
paragraph with :mod:`debian.deb822`; the tar members are streamed with the
standard library, decompressed under a bound (:class:`Limits`).

:func:`read_deb` returns a :class:`DebPackage`: the SHA-256 of every regular
file of the data archive at its installed path (hard links under each name),
and of every control member (the maintainer scripts dpkg runs as root, and
the control files dpkg copies into ``/var/lib/dpkg/info``). Whatever the
input, it raises only :class:`PackageError`.
"""

from __future__ import annotations

import bz2
import dataclasses
import gzip
import hashlib
import io
import lzma
import os
import tarfile
import zlib
from collections.abc import Iterator
from typing import IO, Any, BinaryIO

from nova_plugin.exceptions import PackageError

__all__ = ["DEFAULT_LIMITS", "DEFAULT_MAX_BYTES", "DebPackage", "Limits", "read_deb"]

#: The default bound on the bytes one archive or index decompresses to.
DEFAULT_MAX_BYTES = 4 << 30
_CHUNK = 1 << 20
#: The most memory an xz header may make the decompressor take (xz -9e
#: needs 65 MiB).
_XZ_MEMORY = 256 << 20
_COMPRESSIONS = ("", ".gz", ".xz", ".zst", ".bz2", ".lzma")


@dataclasses.dataclass(frozen=True)
class Limits:
    """Bounds on what a package source may make us read.

    Attributes:
        max_bytes: the most bytes one archive member, index or download
            may decompress (or download) to.
    """

    max_bytes: int = DEFAULT_MAX_BYTES


#: The default :class:`Limits`.
DEFAULT_LIMITS = Limits()


@dataclasses.dataclass(frozen=True)
class DebPackage:
    """What one ``.deb`` installs.

    Attributes:
        package: its name (``Package``).
        version: its version (``Version``, with any epoch).
        architecture: ``Architecture`` (``amd64``, ``all``...).
        multi_arch: ``Multi-Arch`` (``same``, ``foreign``...) or "".
        sha256: the digest of the ``.deb`` itself.
        files: installed path -> SHA-256 of every regular file.
        control: control member name -> SHA-256 (``control`` included).
        conffiles: the paths of its conffiles.
        trigger_interests: trigger names (not paths) it is interested in.
    """

    package: str
    version: str
    architecture: str
    multi_arch: str
    sha256: bytes
    files: dict[str, bytes]
    control: dict[str, bytes]
    conffiles: tuple[str, ...]
    trigger_interests: tuple[str, ...]

    @property
    def deb_name(self) -> str:
        """The name apt stores it under in ``/var/cache/apt/archives``."""
        version = self.version.replace(":", "%3a")
        return f"{self.package}_{version}_{self.architecture}.deb"

    @property
    def dpkg_name(self) -> str:
        """Its name in ``/var/lib/dpkg/info`` (``PKG:ARCH`` if Multi-Arch: same)."""
        if self.multi_arch == "same":
            return f"{self.package}:{self.architecture}"
        return self.package


class _Guarded:
    """A file that refuses to seek backwards (relative) or past its end, so
    a forged ar size cannot loop or read beyond the archive."""

    def __init__(self, stream: BinaryIO, size: int, where: str) -> None:
        self._stream, self._size, self._where = stream, size, where

    def read(self, size: int = -1) -> bytes:
        return self._stream.read(size)

    def tell(self) -> int:
        return self._stream.tell()

    def seek(self, offset: int, whence: int = 0) -> int:
        here = self._stream.tell()
        target = {0: offset, 1: here + offset, 2: self._size + offset}[whence]
        if whence == 1 and offset < 0:
            raise PackageError(self._where, "corrupt ar archive (negative size)")
        if not 0 <= target <= self._size:
            raise PackageError(self._where, "truncated ar archive")
        return self._stream.seek(target)


class _Counted(io.RawIOBase):
    """A decompressed stream that fails once it has given ``limit`` bytes."""

    def __init__(self, inner: IO[bytes], limit: int, where: str) -> None:
        super().__init__()
        self._inner, self._left, self._where = inner, limit, where

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._inner.read(min(len(buffer), _CHUNK))
        self._left -= len(data)
        if self._left < 0:
            raise PackageError(self._where, "decompresses past the size limit")
        buffer[: len(data)] = data
        return len(data)


class _Member:
    """An ar member as a read-only stream (what the decompressors read)."""

    def __init__(self, member: Any) -> None:
        self._member = member

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            return bytes(self._member.read())
        return bytes(self._member.read(size)) if size else b""

    def readable(self) -> bool:
        return True


class _Unxz(io.RawIOBase):
    """An xz (or lzma) stream decompressed with a bound on the memory its
    header may ask for (lzma.LZMAFile has none)."""

    def __init__(self, source: _Member, fmt: int) -> None:
        super().__init__()
        self._source = source
        self._lzma = lzma.LZMADecompressor(fmt, memlimit=_XZ_MEMORY)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._lzma.eof:
            data = b""
            if self._lzma.needs_input:
                data = self._source.read(_CHUNK)
                if not data:
                    raise EOFError("truncated xz stream")
            out = self._lzma.decompress(data, len(buffer))
            if out:
                buffer[: len(out)] = out
                return len(out)
        return 0


def _decompressed(raw: _Member, suffix: str) -> IO[bytes]:
    source: Any = raw
    if suffix == ".gz":
        return gzip.GzipFile(fileobj=source, mode="rb")  # type: ignore[return-value]
    if suffix in (".xz", ".lzma"):
        fmt = lzma.FORMAT_XZ if suffix == ".xz" else lzma.FORMAT_ALONE
        return io.BufferedReader(_Unxz(raw, fmt), _CHUNK)
    if suffix == ".bz2":
        return bz2.BZ2File(source, "rb")
    if suffix == ".zst":
        import zstandard  # only .debs compressed with zstd need it

        reader: IO[bytes] = zstandard.ZstdDecompressor().stream_reader(
            source, read_across_frames=True
        )
        return reader
    return source  # type: ignore[no-any-return]


def _errors() -> tuple[type[BaseException], ...]:
    """Every exception a library may raise on a corrupt archive."""
    from debian.arfile import ArError

    found: list[type[BaseException]] = [
        ArError,
        tarfile.TarError,
        lzma.LZMAError,
        zlib.error,
        EOFError,
        OSError,
        ValueError,
        KeyError,
        IndexError,
        UnicodeError,
        OverflowError,
        TypeError,
    ]
    try:
        import zstandard

        found.append(zstandard.ZstdError)
    except ImportError:  # pragma: no cover - zstandard is a client extra
        pass
    return tuple(found)


def installed_path(name: str, where: str) -> str:
    """A data archive member's name as an absolute path (``./usr/bin/x`` ->
    ``/usr/bin/x``).

    Raises:
        PackageError: the name has a ``..`` component or a NUL.
    """
    parts = name.split("/")
    if ".." in parts or "\0" in name:
        raise PackageError(where, f"member {name[:200]!r}: path with '..'")
    return os.path.normpath("/" + "/".join(p for p in parts if p not in ("", ".")))


def _tar_members(
    stream: IO[bytes], where: str, limits: Limits
) -> Iterator[tuple[tarfile.TarInfo, IO[bytes] | None]]:
    counted = io.BufferedReader(_Counted(stream, limits.max_bytes, where), _CHUNK)
    with tarfile.open(fileobj=counted, mode="r|") as archive:
        for info in archive:
            yield info, archive.extractfile(info) if info.isreg() else None


def _sha256(stream: IO[bytes]) -> bytes:
    hasher = hashlib.sha256()
    while chunk := stream.read(_CHUNK):
        hasher.update(chunk)
    return hasher.digest()


def _data_files(stream: IO[bytes], where: str, limits: Limits) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    for info, content in _tar_members(stream, where, limits):
        path = installed_path(info.name, where)
        if info.isreg():
            assert content is not None
            files[path] = _sha256(content)
        elif info.islnk():
            target = installed_path(info.linkname, where)
            if target not in files:
                raise PackageError(where, f"hard link {path} to a file not before it")
            files[path] = files[target]
        elif not (info.isdir() or info.issym()):
            raise PackageError(where, f"{path}: not a file, link or directory")
    return files


def _control_files(
    stream: IO[bytes], where: str, limits: Limits
) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """(member -> SHA-256, the bodies of control, conffiles and triggers)."""
    out: dict[str, bytes] = {}
    bodies: dict[str, bytes] = {}
    for info, content in _tar_members(stream, where, limits):
        name = installed_path(info.name, where)[1:]
        if info.isdir() and not name:
            continue
        if not info.isreg() or "/" in name or not name:
            raise PackageError(where, f"control member {info.name!r} not a plain file")
        assert content is not None
        body = content.read(1 << 24)
        if content.read(1):
            raise PackageError(where, f"control member {name} over 16 MiB")
        out[name] = hashlib.sha256(body).digest()
        if name in ("control", "conffiles", "triggers"):
            bodies[name] = body
    if "control" not in out:
        raise PackageError(where, "no control file in control.tar")
    return out, bodies


def _member(archive: Any, stem: str, where: str) -> tuple[Any, str]:
    found = [
        (archive.getmember(stem + s), s)
        for s in _COMPRESSIONS
        if stem + s in archive.getnames()
    ]
    if len(found) != 1:
        raise PackageError(where, f"not a Debian package: {len(found)} {stem} members")
    return found[0]


def _paragraph(body: bytes, where: str) -> dict[str, str]:
    from debian.deb822 import Deb822

    fields = Deb822(body.decode("utf-8", "strict").splitlines())
    out = {k: str(v).strip() for k, v in fields.items()}
    for key in ("Package", "Version", "Architecture"):
        if not out.get(key) or any(c.isspace() or c == "/" for c in out[key]):
            raise PackageError(where, f"control: bad or missing {key}")
    return out


def read_deb(path: str, limits: Limits = DEFAULT_LIMITS) -> DebPackage:
    """Read one ``.deb``.

    Args:
        path: the file.
        limits: bounds on the decompressed sizes.

    Returns:
        What it installs.

    Raises:
        PackageError: unreadable, truncated or corrupt (ar, tar,
            compression), a member path with ``..``, a device or FIFO,
            or past ``limits``.
    """
    where = path
    try:
        with open(path, "rb") as stream:
            return _read(stream, os.fstat(stream.fileno()).st_size, where, limits)
    except PackageError:
        raise
    except _errors() as exc:
        raise PackageError(where, f"corrupt or unreadable package: {exc}") from None


def _read(stream: BinaryIO, size: int, where: str, limits: Limits) -> DebPackage:
    from debian.arfile import ArFile

    digest = _sha256(stream)
    stream.seek(0)
    guarded: Any = _Guarded(stream, size, where)
    archive = ArFile(fileobj=guarded)
    members = archive.getmembers()
    if not members or members[0].name != "debian-binary":
        raise PackageError(where, "not a Debian package (no debian-binary first)")
    if not members[0].read(4).startswith(b"2."):
        raise PackageError(where, "unsupported package format (debian-binary)")
    member, suffix = _member(archive, "control.tar", where)
    stream_in = _decompressed(_Member(member), suffix)
    control, bodies = _control_files(stream_in, where, limits)
    member, suffix = _member(archive, "data.tar", where)
    files = _data_files(_decompressed(_Member(member), suffix), where, limits)
    fields = _paragraph(bodies["control"], where)
    conffiles = tuple(
        installed_path(line.strip(), where)
        for line in bodies.get("conffiles", b"").decode("utf-8", "strict").splitlines()
        if line.strip() and not line.startswith("remove-on-upgrade ")
    )
    interests = []
    for line in bodies.get("triggers", b"").decode("utf-8", "strict").splitlines():
        words = line.split()
        if len(words) == 2 and words[0].startswith("interest") and "/" not in words[1]:
            interests.append(words[1])
    return DebPackage(
        package=fields["Package"],
        version=fields["Version"],
        architecture=fields["Architecture"],
        multi_arch=fields.get("Multi-Arch", ""),
        sha256=digest,
        files=files,
        control=control,
        conffiles=conffiles,
        trigger_interests=tuple(interests),
    )
