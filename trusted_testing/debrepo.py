"""Real Debian packages and a real signed apt repository, for tests and
benchmarks of package-derived policies.

:func:`build_deb` makes a ``.deb`` with ``dpkg-deb --build``;
:func:`signing_key` makes a throwaway OpenPGP key in its own GNUPGHOME;
:func:`build_repository` lays out ``pool/`` and ``dists/SUITE/`` with
``apt-ftparchive`` and signs ``InRelease`` and ``Release.gpg`` with
``gpg``; :func:`serve` serves a directory over http on 127.0.0.1.
"""

from __future__ import annotations

import dataclasses
import functools
import http.server
import lzma
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

__all__ = [
    "Key",
    "build_deb",
    "build_repository",
    "fetch_debian_debs",
    "serve",
    "sign_release",
    "signing_key",
]


def build_deb(
    out_dir: str,
    name: str,
    version: str,
    files: Mapping[str, bytes],
    *,
    arch: str = "amd64",
    scripts: Mapping[str, bytes] | None = None,
    conffiles: Sequence[str] = (),
    multi_arch: str = "",
    compression: str = "xz",
    extra_control: str = "",
) -> str:
    """A ``.deb`` of ``files`` (installed path -> content); its path."""
    root = os.path.join(out_dir, f"build-{name}-{version.replace(':', '_')}")
    debian = os.path.join(root, "DEBIAN")
    os.makedirs(debian)
    for path, content in files.items():
        full = os.path.join(root, path.lstrip("/"))
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as out:
            out.write(content)
        os.chmod(full, 0o755 if "/bin/" in path else 0o644)
    control = (
        f"Package: {name}\nVersion: {version}\nArchitecture: {arch}\n"
        f"Maintainer: Test <test@example.org>\nDescription: test package {name}\n"
    )
    if multi_arch:
        control += f"Multi-Arch: {multi_arch}\n"
    with open(os.path.join(debian, "control"), "w", encoding="utf-8") as out:
        out.write(control + extra_control)
    for script, body in (scripts or {}).items():
        path = os.path.join(debian, script)
        with open(path, "wb") as out:
            out.write(body)
        os.chmod(path, 0o755)
    if conffiles:
        with open(os.path.join(debian, "conffiles"), "w", encoding="utf-8") as out:
            out.write("".join(c + "\n" for c in conffiles))
    deb = os.path.join(out_dir, f"{name}_{version.replace(':', '%3a')}_{arch}.deb")
    subprocess.run(
        ["dpkg-deb", f"-Z{compression}", "--root-owner-group", "--build", root, deb],
        check=True,
        capture_output=True,
    )
    shutil.rmtree(root)
    return deb


@dataclasses.dataclass(frozen=True)
class Key:
    """A throwaway signing key.

    Attributes:
        home: its GNUPGHOME.
        keyring: its public key, exported (binary) to a file.
        fingerprint: its fingerprint.
    """

    home: str
    keyring: str
    fingerprint: str


def signing_key(
    home: str,
    uid: str = "Test Repository <repo@example.org>",
    *,
    expire: str = "never",
    faked_time: str | None = None,
) -> Key:
    """A new ed25519 key in GNUPGHOME ``home``, its public key exported.

    ``faked_time`` (gpg's ``--faked-system-time``, e.g. ``20200101T000000``)
    makes it, and the signatures :func:`sign_release` makes with it, in the
    past: with ``expire="1d"``, a key long expired.
    """
    os.makedirs(home, mode=0o700, exist_ok=True)
    env = {**os.environ, "GNUPGHOME": home}
    if faked_time:
        with open(os.path.join(home, "gpg.conf"), "w", encoding="utf-8") as out:
            out.write(f"faked-system-time {faked_time}\n")
    subprocess.run(
        ["gpg", "--batch", "--pinentry-mode", "loopback", "--passphrase", "",
         "--quick-gen-key", uid, "ed25519", "sign", expire],
        check=True, capture_output=True, env=env,
    )  # fmt: skip
    listing = subprocess.run(
        ["gpg", "--batch", "--with-colons", "--list-keys", uid],
        check=True, capture_output=True, text=True, env=env,
    ).stdout  # fmt: skip
    fingerprint = next(
        line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:")
    )
    keyring = os.path.join(home, "public.gpg")
    with open(keyring, "wb") as out:
        subprocess.run(
            ["gpg", "--batch", "--export", fingerprint],
            check=True, stdout=out, env=env,
        )  # fmt: skip
    return Key(home, keyring, fingerprint)


def sign_release(key: Key, release: str, *, digest: str = "SHA512") -> None:
    """Write ``InRelease`` and ``Release.gpg`` beside ``release``."""
    env = {**os.environ, "GNUPGHOME": key.home}
    folder = os.path.dirname(release)
    base = ["gpg", "--batch", "--yes", "--local-user", key.fingerprint,
            "--digest-algo", digest]  # fmt: skip
    subprocess.run(
        [*base, "--clearsign", "-o", os.path.join(folder, "InRelease"), release],
        check=True, capture_output=True, env=env,
    )  # fmt: skip
    subprocess.run(
        [*base, "--detach-sign", "-o", os.path.join(folder, "Release.gpg"), release],
        check=True, capture_output=True, env=env,
    )  # fmt: skip


def build_repository(
    root: str,
    debs: Sequence[str],
    key: Key | None,
    *,
    suite: str = "stable",
    component: str = "main",
    arch: str = "amd64",
) -> None:
    """Lay out ``root`` as an apt repository of ``debs`` (copied to
    ``pool/``), indexed by apt-ftparchive, signed by ``key`` (None:
    unsigned)."""
    pool = os.path.join(root, "pool", component)
    os.makedirs(pool, exist_ok=True)
    for deb in debs:
        shutil.copy(deb, pool)
    binary = os.path.join(root, "dists", suite, component, f"binary-{arch}")
    os.makedirs(binary, exist_ok=True)
    packages = subprocess.run(
        ["apt-ftparchive", "packages", f"pool/{component}"],
        check=True, capture_output=True, cwd=root,
    ).stdout  # fmt: skip
    with open(os.path.join(binary, "Packages"), "wb") as out:
        out.write(packages)
    with open(os.path.join(binary, "Packages.xz"), "wb") as out:
        out.write(lzma.compress(packages))
    dists = os.path.join(root, "dists", suite)
    release = subprocess.run(
        ["apt-ftparchive",
         "-o", f"APT::FTPArchive::Release::Suite={suite}",
         "-o", f"APT::FTPArchive::Release::Codename={suite}",
         "-o", f"APT::FTPArchive::Release::Components={component}",
         "-o", f"APT::FTPArchive::Release::Architectures={arch}",
         "release", "."],
        check=True, capture_output=True, cwd=dists,
    ).stdout  # fmt: skip
    path = os.path.join(dists, "Release")
    with open(path, "wb") as out:
        out.write(release)
    if key is not None:
        sign_release(key, path)


@contextmanager
def serve(directory: str) -> Iterator[str]:
    """Serve ``directory`` over http on 127.0.0.1; yields its URL."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    handler = functools.partial(Quiet, directory=directory)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def fetch_debian_debs(cache: str, names: Sequence[str]) -> list[str]:
    """``apt-get download`` of ``names`` into ``cache`` (kept between runs);
    the paths of those that are there afterwards."""
    os.makedirs(cache, exist_ok=True)
    have = {f.split("_")[0] for f in os.listdir(cache) if f.endswith(".deb")}
    missing = [n for n in names if n not in have]
    if missing:
        subprocess.run(
            ["apt-get", "download", "-q", *missing],
            cwd=cache, capture_output=True, timeout=600, check=False,
        )  # fmt: skip
    return sorted(
        os.path.join(cache, f)
        for f in os.listdir(cache)
        if f.endswith(".deb") and f.split("_")[0] in names
    )
