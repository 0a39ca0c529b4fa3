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
* :class:`AptRepo` lays the ``.deb`` files out as a signed ``dists/``
  repository with :mod:`trusted_testing.debrepo` (``apt-ftparchive``, a
  throwaway OpenPGP key in a temporary ``GNUPGHOME`` whose public key,
  :attr:`AptRepo.keyring`, is a binary keyring for ``signed-by=`` and
  ``gpgv --keyring``) and serves the tree over HTTP on 127.0.0.1 (a guest
  on qemu's user network reaches it at ``http://10.0.2.2:PORT``).

Nothing here is a fake of apt: the packages, their control data and the
signature are what apt and dpkg in the guest check.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import glob
import hashlib
import io
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterable, Sequence

from trusted_testing import debrepo
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


class AptRepo:
    """A signed ``dists/`` repository in ``directory`` (see the module doc).

    Attributes:
        directory: The repository's root (``dists/``, ``pool/``).
        keyring: The signing key's public part, a binary OpenPGP keyring.
        port: The HTTP port on 127.0.0.1 once :meth:`serve` ran, else None.
    """

    def __init__(self, directory: str) -> None:
        self.directory = os.path.abspath(directory)
        self._gnupg = tempfile.mkdtemp(prefix="gpg-")  # short: agent socket
        self._key = debrepo.signing_key(
            self._gnupg, "Tenant archive <archive@example.invalid>"
        )
        self.keyring = self._key.keyring
        self.port: int | None = None
        self._served = contextlib.ExitStack()

    @property
    def url(self) -> str:
        """The repository as the host reaches it."""
        if self.port is None:
            raise AptRepoError("the repository is not served")
        return f"http://127.0.0.1:{self.port}"

    def guest_url(self, host: str = "10.0.2.2") -> str:
        """The repository as a guest on qemu's user network reaches it."""
        return self.url.replace("127.0.0.1", host, 1)

    def source_line(self, url: str, keyring_path: str) -> str:
        """A one-line-style apt source of this repository."""
        return f"deb [signed-by={keyring_path}] {url} {SUITE} {COMPONENT}\n"

    def publish(self, debs: Iterable[Deb]) -> None:
        """Lay out the repository of ``debs`` and sign its ``Release``."""
        paths = [deb.path for deb in debs]
        debrepo.build_repository(
            self.directory, paths, self._key, suite=SUITE, component=COMPONENT
        )

    def serve(self) -> int:
        """Serve the repository on 127.0.0.1 (a free port) in a thread."""
        if self.port is None:
            url = self._served.enter_context(debrepo.serve(self.directory))
            self.port = int(url.rsplit(":", 1)[1])
        return self.port

    def close(self) -> None:
        """Stop serving, end the key's gpg-agent and remove the key."""
        self._served.close()
        self.port = None
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
