"""An apt repository, verified as apt does, down to the ``.deb`` files.

The chain of trust (the Debian repository format,
https://wiki.debian.org/DebianRepository/Format; steps 2 and 3 are in
:mod:`nova_plugin.aptindex`):

1. ``dists/SUITE/InRelease`` (or ``Release`` with ``Release.gpg``) must
   carry a good OpenPGP signature by a key of the keyring the tenant names,
   and nothing else: ``gpgv`` (GnuPG's verify-only tool, the one apt uses on
   Debian 12) with ``--keyring`` and an empty home directory. Only the text
   gpgv says is signed is read. A signature with MD5, SHA-1 or RIPEMD-160
   is refused, as apt refuses it; so is a Release whose ``Valid-Until`` has
   passed or whose ``Suite``/``Codename`` is not the one asked for.
2. ``COMPONENT/binary-ARCH/Packages`` (``.xz``, ``.gz`` or plain) must have
   the size and SHA-256 the verified Release lists.
3. Each selected package's ``.deb`` (its ``Filename``) must have the size
   and SHA-256 its ``Packages`` stanza lists, and its control paragraph
   the same name, version and architecture.

A repository is a
local directory laid out as one (``dists/``, ``pool/``) or an http(s) URL
(urllib, with a timeout and a size bound on every answer). Any failure
raises :class:`PackageError` naming the file.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from typing import IO

from nova_plugin.debs import DEFAULT_LIMITS, Limits
from nova_plugin.exceptions import PackageError

__all__ = ["Repository", "read_local", "safe_relative", "verify_signed"]

_CHUNK = 1 << 20
_TIMEOUT = 60.0
#: OpenPGP hash algorithms apt refuses (RFC 4880 9.4): MD5, SHA-1, RIPEMD-160.
_WEAK_HASHES = {"1", "2", "3"}


def safe_relative(path: str, where: str) -> str:
    parts = path.split("/")
    if not path or path.startswith("/") or ".." in parts or "\0" in path:
        raise PackageError(where, f"unsafe path {path[:200]!r}")
    return path


class Repository:
    """A local directory or an http(s) URL laid out as an apt repository.

    Args:
        location: the directory or URL (its root: ``dists/`` is below it).
        limits: the most bytes one download or index may have.
        timeout: seconds for each network operation.
    """

    def __init__(
        self, location: str, limits: Limits = DEFAULT_LIMITS, timeout: float = _TIMEOUT
    ) -> None:
        self.location = location
        self.limits = limits
        self.timeout = timeout
        scheme = urllib.parse.urlsplit(location).scheme
        self.remote = scheme in ("http", "https")
        if not self.remote and not os.path.isdir(location):
            raise PackageError(location, "not a directory nor an http(s) URL")

    def where(self, path: str) -> str:
        """How errors name ``path`` of this repository."""
        if self.remote:
            return self.location.rstrip("/") + "/" + path
        return os.path.join(self.location, path)

    def suites(self) -> list[str]:
        """The suites under ``dists/`` (a local repository only; else [])."""
        if self.remote:
            return []
        try:
            return sorted(os.listdir(os.path.join(self.location, "dists")))
        except OSError:
            return []

    def open(self, path: str) -> IO[bytes] | None:
        """A stream of ``path`` (relative to the root); None if it does not
        exist there.

        Raises:
            PackageError: any other failure.
        """
        where = self.where(safe_relative(path, self.location))
        try:
            if not self.remote:
                if not os.path.isfile(where):
                    return None
                return open(where, "rb")
            url = self.location.rstrip("/") + "/" + urllib.parse.quote(path)
            # the scheme is http or https (checked in __init__)
            return urllib.request.urlopen(url, timeout=self.timeout)  # type: ignore[no-any-return]  # noqa: S310
        except urllib.error.HTTPError as exc:
            if exc.code in (403, 404, 410):
                return None
            raise PackageError(where, f"HTTP {exc.code}") from None
        except (OSError, ValueError) as exc:
            raise PackageError(where, f"cannot fetch: {exc}") from None

    def fetch(self, path: str, limit: int | None = None) -> bytes | None:
        """The bytes of ``path`` (at most ``limit``); None if missing."""
        limit = self.limits.max_bytes if limit is None else limit
        stream = self.open(path)
        if stream is None:
            return None
        chunks, got = [], 0
        with stream:
            try:  # in chunks: read(n) may allocate n bytes at once
                while chunk := stream.read(min(_CHUNK, limit + 1 - got)):
                    chunks.append(chunk)
                    got += len(chunk)
                    if got > limit:
                        raise PackageError(
                            self.where(path), f"larger than {limit} bytes"
                        )
            except OSError as exc:
                raise PackageError(self.where(path), f"cannot read: {exc}") from None
        return b"".join(chunks)

    def fetch_to(self, path: str, out: IO[bytes], size: int) -> bytes:
        """Copy ``path`` (``size`` bytes expected) into ``out``; its SHA-256.

        Raises:
            PackageError: missing, or not ``size`` bytes long.
        """
        where = self.where(path)
        if size > self.limits.max_bytes:
            raise PackageError(where, f"larger than {self.limits.max_bytes} bytes")
        stream = self.open(path)
        if stream is None:
            raise PackageError(where, "listed in the index but missing")
        hasher, got = hashlib.sha256(), 0
        with stream:
            try:
                while chunk := stream.read(min(_CHUNK, size + 1 - got)):
                    got += len(chunk)
                    if got > size:
                        break
                    hasher.update(chunk)
                    out.write(chunk)
            except OSError as exc:
                raise PackageError(where, f"cannot read: {exc}") from None
        if got != size:
            raise PackageError(where, f"size differs from the index ({size} bytes)")
        return hasher.digest()


def read_local(path: str, limit: int) -> bytes:
    """A local file of at most ``limit`` bytes.

    Raises:
        PackageError: unreadable or larger.
    """
    try:
        with open(path, "rb") as handle:
            if os.fstat(handle.fileno()).st_size > limit:
                raise PackageError(path, f"larger than {limit} bytes")
            return handle.read()
    except OSError as exc:
        raise PackageError(path, f"cannot read: {exc}") from None


def _dearmor(data: bytes, where: str) -> bytes:
    """A binary keyring from an ASCII-armored one (gpgv reads binary)."""
    import base64
    import binascii

    text = data.decode("ascii", "replace").splitlines()
    out = b""
    inside, body = False, False
    chunks: list[str] = []
    for line in text:
        line = line.strip()
        if line.startswith("-----BEGIN PGP PUBLIC KEY BLOCK"):
            inside, body, chunks = True, False, []
        elif line.startswith("-----END PGP PUBLIC KEY BLOCK") and inside:
            try:
                out += base64.b64decode("".join(chunks), validate=True)
            except (binascii.Error, ValueError):
                raise PackageError(where, "bad ASCII armor in the keyring") from None
            inside = False
        elif inside and not body:
            body = not line or ":" not in line
            if body and line:
                chunks.append(line)
        elif inside and not line.startswith("="):
            chunks.append(line)
    if not out:
        raise PackageError(where, "no public key block in the keyring")
    return out


def _gpgv() -> str:
    found = shutil.which("gpgv")
    if found is None:
        raise PackageError(
            "gpgv",
            "not found: install it (Debian and Ubuntu: package gpgv; "
            "macOS: gnupg) to verify repositories",
        )
    return found


def verify_signed(
    data: bytes,
    signature: bytes | None,
    keyring: str,
    where: str,
) -> bytes:
    """The text a good signature by a key of ``keyring`` covers.

    Args:
        data: a clear-signed ``InRelease`` (``signature`` None), or a
            ``Release`` with its detached ``Release.gpg``.
        signature: the detached signature, or None.
        keyring: the tenant's keyring (binary or ASCII-armored OpenPGP keys,
            or a GnuPG keybox); no other key is trusted.
        where: the name of the signed file, for errors.

    Raises:
        PackageError: not signed, a bad signature, signed only by keys not
            in the keyring, a weak digest, or an unreadable keyring.
    """
    gpgv = _gpgv()
    keys = read_local(keyring, 64 << 20)
    if b"-----BEGIN PGP PUBLIC KEY BLOCK" in keys[:4096]:
        keys = _dearmor(keys, keyring)
    with tempfile.TemporaryDirectory(prefix="trusted-gpgv-") as home:
        ring = os.path.join(home, "tenant.gpg")
        with open(ring, "wb") as out:
            out.write(keys)
        signed = os.path.join(home, "signed")
        with open(signed, "wb") as out:
            out.write(data)
        command = [gpgv, "--homedir", home, "--keyring", ring, "--status-fd", "1"]
        if signature is None:
            if not data.lstrip().startswith(b"-----BEGIN PGP SIGNED MESSAGE-----"):
                raise PackageError(where, "not signed (no clear-signed message)")
            plain = os.path.join(home, "plain")
            command += ["--output", plain, signed]
        else:
            detached = os.path.join(home, "detached.sig")
            with open(detached, "wb") as out:
                out.write(signature)
            command += [detached, signed]
        try:
            result = subprocess.run(
                command, capture_output=True, timeout=120, check=False
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise PackageError("gpgv", f"cannot run: {exc}") from None
        _judge_status(result.stdout.decode("utf-8", "replace"), where)
        if signature is not None:
            return data
        with open(plain, "rb") as handle:
            return handle.read()


def _judge_status(status: str, where: str) -> None:
    """Accept as apt does: at least one signature that is good (GOODSIG),
    valid (VALIDSIG) and made with a strong hash, and no bad one anywhere;
    signatures by keys the keyring lacks are tolerated beside a good one.
    gpgv exits 0 for a signature by an expired key (EXPKEYSIG with a
    VALIDSIG): that one is not good."""
    groups: list[list[list[str]]] = []
    for line in status.splitlines():
        words = line.split()[1:] if line.startswith("[GNUPG:] ") else []
        if words and (words[0] == "NEWSIG" or not groups):
            groups.append([])
        if words:
            groups[-1].append(words)
    kinds = [{w[0] for w in group} for group in groups]
    if any("BADSIG" in k for k in kinds):
        raise PackageError(where, "bad signature")
    problems = set()
    for group, seen in zip(groups, kinds, strict=True):
        valid = [w for w in group if w[0] == "VALIDSIG" and len(w) > 8]
        if "GOODSIG" in seen and valid:
            if all(w[8] not in _WEAK_HASHES for w in valid):
                return
            problems.add("signed with a weak digest (MD5/SHA-1/RIPEMD-160)")
        for bad in ("EXPKEYSIG", "REVKEYSIG", "EXPSIG"):
            if bad in seen:
                problems.add(f"signature not valid ({bad})")
    if problems:
        raise PackageError(where, "; ".join(sorted(problems)))
    missing = {
        w[1]
        for g in groups
        for w in g
        if w[0] in ("NO_PUBKEY", "ERRSIG") and len(w) > 1
    }
    if missing:
        keys = ", ".join(sorted(missing))
        raise PackageError(where, f"signed by a key not in the keyring ({keys})")
    if not any("NEWSIG" in k for k in kinds):
        raise PackageError(where, "not signed")
    raise PackageError(where, "signature not valid")
