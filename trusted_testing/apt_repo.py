"""A signed apt repository of real Debian packages, served on loopback.

The patching story (issue 28) installs and upgrades packages in a real
guest from a repository the test makes, as a tenant's own mirror would be:

* :func:`fetch` downloads a package's ``.deb`` from the host's apt sources
  with ``apt-get download PKG=VERSION`` into a cache outside the
  repository (``$TRUSTED_APT_DEB_CACHE`` or
  ``~/.cache/trusted-cloud/apt-debs``), one file per ``package=version``;
* :func:`versions` asks ``apt-cache madison`` which versions the host's
  sources offer (a package with two, e.g. one in ``bookworm`` and a newer
  one in ``bookworm-security``, is an upgrade);
* :class:`AptRepo` lays the ``.deb`` files out as a ``dists/`` repository
  (``pool/``, ``Packages``, ``Packages.gz``, ``Release``), signs
  ``Release`` into ``InRelease`` and ``Release.gpg`` with a throw-away
  OpenPGP key made in a temporary ``GNUPGHOME`` (the public key is
  :attr:`AptRepo.keyring`, a binary keyring for ``signed-by=`` and
  ``gpgv --keyring``), and serves the tree over HTTP on 127.0.0.1 (a guest
  on qemu's user network reaches it at ``http://10.0.2.2:PORT``).

Nothing here is a fake of apt: the packages, their control data and the
signature are what apt and dpkg in the guest check.
"""

from __future__ import annotations

import dataclasses
import email.utils
import functools
import glob
import gzip
import hashlib
import http.server
import io
import os
import shutil
import subprocess
import tarfile
import tempfile
import threading
import urllib.parse
from collections.abc import Iterable, Sequence
from typing import Any

from trusted_testing.guest_image import cache_lock

__all__ = [
    "AptRepo",
    "AptRepoError",
    "Deb",
    "cache_dir",
    "fetch",
    "refresh_lists",
    "versions",
]

#: The suite (and codename) and component of the repository (the suite is
#: what ``policy generate runtime --apt-repo`` reads by default).
SUITE = "stable"
COMPONENT = "main"


class AptRepoError(Exception):
    """A tool failed or the host's apt sources lack what was asked."""


@dataclasses.dataclass(frozen=True)
class Deb:
    """A downloaded package file.

    Attributes:
        package: Its name.
        version: Its version (with any epoch).
        architecture: ``amd64``, ``all``, ...
        path: The ``.deb`` in the cache.
    """

    package: str
    version: str
    architecture: str
    path: str

    def control(self) -> str:
        """The package's control paragraph (``dpkg-deb -f``)."""
        return _run(["dpkg-deb", "-f", self.path]).rstrip("\n") + "\n"

    def files(self) -> dict[str, str]:
        """Path -> SHA-256 (hex) of each regular file its data archive
        installs (read with ``dpkg-deb --fsys-tarfile``)."""
        archive = _run_bytes(["dpkg-deb", "--fsys-tarfile", self.path])
        found = {}
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            for member in tar:
                handle = tar.extractfile(member) if member.isfile() else None
                if handle is not None:
                    path = "/" + member.name.removeprefix("./")
                    found[path] = hashlib.sha256(handle.read()).hexdigest()
        return found


def cache_dir() -> str:
    """The ``.deb`` cache (``$TRUSTED_APT_DEB_CACHE`` or the user's cache)."""
    env = os.environ.get("TRUSTED_APT_DEB_CACHE")
    if env:
        return env
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(base, "trusted-cloud", "apt-debs")


def _run_bytes(
    argv: Sequence[str],
    *,
    cwd: str | None = None,
    env: dict[str, str] | None = None,
    stdin: bytes | None = None,
) -> bytes:
    try:
        done = subprocess.run(
            list(argv), cwd=cwd, env=env, input=stdin, capture_output=True, check=False
        )
    except FileNotFoundError as exc:
        raise AptRepoError(
            f"{argv[0]} is missing (see tools/apt-packages.txt)"
        ) from exc
    if done.returncode:
        err = done.stderr.decode(errors="replace")[-800:]
        raise AptRepoError(f"{' '.join(argv)} failed ({done.returncode}): {err}")
    return done.stdout


def _run(
    argv: Sequence[str],
    *,
    cwd: str | None = None,
    env: dict[str, str] | None = None,
    stdin: bytes | None = None,
) -> str:
    return _run_bytes(argv, cwd=cwd, env=env, stdin=stdin).decode()


def versions(package: str) -> list[str]:
    """The versions of ``package`` the host's apt sources offer, oldest
    first (``apt-cache madison``; ordered by ``dpkg --compare-versions``).

    Raises:
        AptRepoError: apt knows no such package.
    """
    found: list[str] = []
    for line in _run(["apt-cache", "madison", package]).splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) >= 3 and parts[0] == package and parts[1] not in found:
            found.append(parts[1])
    if not found:
        raise AptRepoError(f"apt knows no package {package} (run apt-get update)")
    return sorted(found, key=functools.cmp_to_key(_compare_versions))


def refresh_lists() -> None:
    """``apt-get update`` of the host's lists (as root only): stale lists
    name versions the archive no longer has.

    Raises:
        AptRepoError: not root, or apt failed.
    """
    if os.geteuid() != 0:
        raise AptRepoError("apt's lists are stale: run apt-get update and try again")
    _run(["apt-get", "-oDPkg::Lock::Timeout=900", "update", "-qq"])


def _compare_versions(a: str, b: str) -> int:
    if a == b:
        return 0
    lower = subprocess.run(
        ["dpkg", "--compare-versions", a, "lt", b], check=False
    ).returncode
    return -1 if lower == 0 else 1


def _deb_name(package: str, version: str) -> str:
    # apt-get download's file name: the epoch's colon as %3a
    return f"{package}_{version.replace(':', '%3a')}_"


def fetch(package: str, version: str, root: str | None = None) -> Deb:
    """The ``.deb`` of ``package=version``, downloaded once into the cache.

    Raises:
        AptRepoError: apt cannot download it (unknown version, no network).
    """
    root = root or cache_dir()
    os.makedirs(root, exist_ok=True)
    prefix = _deb_name(package, version)
    with cache_lock(root):
        found = glob.glob(os.path.join(glob.escape(root), prefix + "*.deb"))
        if not found:
            work = tempfile.mkdtemp(prefix=".download-", dir=root)
            try:
                _run(["apt-get", "download", "-q", f"{package}={version}"], cwd=work)
                got = glob.glob(os.path.join(glob.escape(work), prefix + "*.deb"))
                if len(got) != 1:
                    raise AptRepoError(
                        f"apt-get download {package}={version} made {os.listdir(work)}"
                    )
                target = os.path.join(root, os.path.basename(got[0]))
                os.rename(got[0], target)
                found = [target]
            finally:
                shutil.rmtree(work, ignore_errors=True)
    path = found[0]
    arch = os.path.basename(path)[len(prefix) : -len(".deb")]
    return Deb(package, version, arch, path)


def _sums(data: bytes) -> tuple[str, str]:
    return hashlib.md5(data).hexdigest(), hashlib.sha256(data).hexdigest()  # noqa: S324


class _Quiet(http.server.SimpleHTTPRequestHandler):
    """Serves the repository; records each path asked instead of logging."""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        requests: list[str] = self.server.requests  # type: ignore[attr-defined]
        requests.append(urllib.parse.unquote(self.path))


class AptRepo:
    """A signed ``dists/`` repository in ``directory`` (see the module doc).

    Attributes:
        directory: The repository's root (``dists/``, ``pool/``).
        keyring: The signing key's public part, a binary OpenPGP keyring.
        fingerprint: The signing key's fingerprint.
        port: The HTTP port on 127.0.0.1 once :meth:`serve` ran, else None.
        requests: The paths the server was asked for.
    """

    def __init__(self, directory: str, architecture: str = "amd64") -> None:
        self.directory = os.path.abspath(directory)
        self.architecture = architecture
        self.debs: list[Deb] = []
        self.keyring = os.path.join(self.directory, "story-archive-keyring.gpg")
        self.fingerprint = ""
        self.port: int | None = None
        self.requests: list[str] = []
        self._gnupg = tempfile.mkdtemp(prefix="gpg-")  # short: agent socket
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        os.makedirs(self.directory, exist_ok=True)
        self._make_key()

    # -- the key ------------------------------------------------------------

    def _gpg(self, *args: str) -> str:
        env = dict(os.environ, GNUPGHOME=self._gnupg)
        return _run(["gpg", "--batch", "--no-tty", *args], env=env)

    def _make_key(self) -> None:
        os.chmod(self._gnupg, 0o700)
        self._gpg(
            "--passphrase", "", "--quick-gen-key",
            "Tenant archive <archive@example.invalid>", "ed25519", "sign", "never",
        )  # fmt: skip
        for line in self._gpg("--with-colons", "--list-secret-keys").splitlines():
            if line.startswith("fpr:"):
                self.fingerprint = line.split(":")[9]
                break
        with open(self.keyring, "wb") as out:
            env = dict(os.environ, GNUPGHOME=self._gnupg)
            out.write(
                _run_bytes(["gpg", "--batch", "--export", self.fingerprint], env=env)
            )

    # -- the repository -----------------------------------------------------

    @property
    def url(self) -> str:
        """The repository as the host reaches it."""
        if self.port is None:
            raise AptRepoError("the repository is not served")
        return f"http://127.0.0.1:{self.port}"

    def guest_url(self, host: str = "10.0.2.2") -> str:
        """The repository as a guest on qemu's user network reaches it."""
        if self.port is None:
            raise AptRepoError("the repository is not served")
        return f"http://{host}:{self.port}"

    def source_line(self, url: str, keyring_path: str) -> str:
        """A one-line-style apt source of this repository."""
        return f"deb [signed-by={keyring_path}] {url} {SUITE} {COMPONENT}\n"

    def publish(self, debs: Iterable[Deb]) -> None:
        """Set the repository's packages to ``debs`` (replacing any) and
        sign its new ``Release``."""
        self.debs = list(debs)
        pool = os.path.join(self.directory, "pool", COMPONENT)
        shutil.rmtree(pool, ignore_errors=True)
        os.makedirs(pool)
        stanzas = []
        for deb in self.debs:
            name = os.path.basename(deb.path)
            shutil.copyfile(deb.path, os.path.join(pool, name))
            with open(deb.path, "rb") as handle:
                data = handle.read()
            md5, sha256 = _sums(data)
            stanzas.append(
                deb.control()
                + f"Filename: pool/{COMPONENT}/{name}\nSize: {len(data)}\n"
                + f"MD5sum: {md5}\nSHA256: {sha256}\n"
            )
        packages = "\n".join(stanzas).encode()
        dist = os.path.join(self.directory, "dists", SUITE)
        shutil.rmtree(dist, ignore_errors=True)
        index = os.path.join(COMPONENT, f"binary-{self.architecture}")
        os.makedirs(os.path.join(dist, index))
        files = {
            f"{index}/Packages": packages,
            f"{index}/Packages.gz": gzip.compress(packages, mtime=0),
        }
        for rel, data in files.items():
            with open(os.path.join(dist, rel), "wb") as out:
                out.write(data)
        self._write_release(dist, files)

    def _write_release(self, dist: str, files: dict[str, bytes]) -> None:
        lines = [
            "Origin: tenant",
            "Label: tenant",
            f"Suite: {SUITE}",
            f"Codename: {SUITE}",
            f"Date: {email.utils.formatdate(usegmt=True)}",
            f"Architectures: {self.architecture}",
            f"Components: {COMPONENT}",
            "Description: the tenant's packages",
        ]
        for field, which in (("MD5Sum", 0), ("SHA256", 1)):
            lines.append(f"{field}:")
            for rel, data in files.items():
                lines.append(f" {_sums(data)[which]} {len(data):>8} {rel}")
        release = os.path.join(dist, "Release")
        with open(release, "w", encoding="utf-8") as out:
            out.write("\n".join(lines) + "\n")
        key = ("--local-user", self.fingerprint)
        self._gpg(*key, "--clearsign", "-o", os.path.join(dist, "InRelease"), release)
        self._gpg(*key, "--detach-sign", "-o", release + ".gpg", release)

    # -- serving ------------------------------------------------------------

    def serve(self) -> int:
        """Serve the repository on 127.0.0.1 (a free port) in a thread."""
        if self._server is None:
            handler = functools.partial(_Quiet, directory=self.directory)
            server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
            server.requests = self.requests  # type: ignore[attr-defined]
            server.daemon_threads = True
            self._server = server
            self.port = int(server.server_address[1])
            self._thread = threading.Thread(
                target=server.serve_forever, name="apt-repo", daemon=True
            )
            self._thread.start()
        assert self.port is not None
        return self.port

    def close(self) -> None:
        """Stop serving, end the key's gpg-agent and remove the key."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        env = dict(os.environ, GNUPGHOME=self._gnupg)
        subprocess.run(
            ["gpgconf", "--kill", "gpg-agent"],
            env=env,
            capture_output=True,
            check=False,
        )
        shutil.rmtree(self._gnupg, ignore_errors=True)

    def __enter__(self) -> AptRepo:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
