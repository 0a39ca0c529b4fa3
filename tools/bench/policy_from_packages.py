#!/usr/bin/env python3
"""Runtime-policy generation from an apt repository (issue 28, "Speed").

Downloads (once, ``apt-get download``, cached in
``~/.cache/trusted-cloud/bench-debs``) about 30 common Debian packages,
lays them out as a signed apt repository (apt-ftparchive, a throwaway
ed25519 key, gpg), then times the whole of ``policy generate runtime
--apt-repo``: Release signature (gpgv), Packages digest, each ``.deb``
fetched, its digest checked, its archives decompressed and every file
hashed, the policy built and serialised. Reports packages/s, files/s and
MB/s of ``.deb`` for the repository as a directory and over http on
127.0.0.1.

The guest image's installed set: the time for it is the number of
packages it has installed (its ``/var/lib/dpkg/status``) over these
rates; generating for the host's installed set from its local apt cache is
not a realistic measure (the cache holds what the host happened to
download), so this prints the extrapolation, labelled as such, and the cost
of reading the status file itself.

With ``--index FILE`` (an uncompressed ``Packages`` index, e.g. Debian's
main: ``lz4 -dc /var/lib/apt/lists/*_bookworm_main_binary-amd64_Packages.lz4``)
it also times reading a full index (the cost a real mirror adds once).

    .venv/bin/python tools/bench/policy_from_packages.py [--rounds 3]
        [--status /var/lib/dpkg/status] [--index Packages]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))

from nova_plugin.aptindex import installed_set, parse_packages  # noqa: E402
from nova_plugin.aptrepo import Repository  # noqa: E402
from nova_plugin.debpolicy import (  # noqa: E402
    DEFAULT_RULES,
    from_repository,
    package_allowlist,
    rule_excludes,
)
from trusted_testing.debrepo import (  # noqa: E402
    build_repository,
    fetch_debian_debs,
    serve,
    signing_key,
)
from verifier.protocol.ima import RuntimePolicy  # noqa: E402

CACHE = os.path.expanduser("~/.cache/trusted-cloud/bench-debs")
PACKAGES = [
    "bash", "coreutils", "dash", "diffutils", "findutils", "grep", "gzip",
    "hostname", "less", "libc-bin", "libssl3", "login", "openssh-client",
    "openssh-server", "procps", "sed", "tar", "util-linux", "xz-utils",
    "zstd", "curl", "libcurl4", "jq", "libjq1", "libonig5", "tree", "nano",
    "vim-tiny", "iproute2", "iputils-ping", "rsync", "python3-minimal",
]  # fmt: skip


def _once(location: str, keyring: str) -> tuple[float, int, int]:
    start = time.perf_counter()
    packages = from_repository(Repository(location), keyring, suite="bookworm")
    allow = package_allowlist(packages)
    excludes = rule_excludes(DEFAULT_RULES, packages)
    RuntimePolicy("bench", 1, allow, excludes).canonical_json()
    elapsed = time.perf_counter() - start
    return elapsed, len(packages), sum(len(p.files) for p in packages)


def _report(label: str, runs: list[tuple[float, int, int]], size: int) -> float:
    best = min(r[0] for r in runs)
    _, packages, files = runs[0]
    print(
        f"{label:<26} {packages:>4} packages {files:>6} files in {best:6.2f} s: "
        f"{packages / best:7.1f} packages/s {files / best:9.0f} files/s "
        f"{size / best / 1e6:6.1f} MB/s of .deb"
    )
    return packages / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--status", default="/var/lib/dpkg/status")
    parser.add_argument("--index", help="an uncompressed Packages index to time")
    args = parser.parse_args()
    debs = fetch_debian_debs(CACHE, PACKAGES)
    if not debs:
        sys.exit("no .deb could be downloaded (apt-get download): nothing to measure")
    size = sum(os.path.getsize(d) for d in debs)
    print(f"{len(debs)} real Debian packages, {size / 1e6:.1f} MB of .deb ({CACHE})")
    with tempfile.TemporaryDirectory(prefix="bench-repo-") as work:
        key = signing_key(os.path.join(work, "gnupg"))
        repo = os.path.join(work, "repo")
        build_repository(repo, debs, key, suite="bookworm")
        local = [_once(repo, key.keyring) for _ in range(args.rounds)]
        rate = _report("directory", local, size)
        with serve(repo) as url:
            remote = [_once(url, key.keyring) for _ in range(args.rounds)]
        _report("http on 127.0.0.1", remote, size)
    if args.index:
        with open(args.index, "rb") as handle:
            index = handle.read()
        start = time.perf_counter()
        entries = parse_packages(index, args.index)
        took = time.perf_counter() - start
        print(
            f"Packages index {args.index}: {len(index) / 1e6:.1f} MB, "
            f"{len(entries)} stanzas read in {took:.2f} s"
        )
    try:
        with open(args.status, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        print(f"installed set: {args.status} not readable ({exc})")
        return
    start = time.perf_counter()
    installed = installed_set(data, args.status)
    parse = time.perf_counter() - start
    print(
        f"installed set of {args.status}: {len(installed)} packages, read in "
        f"{parse * 1e3:.0f} ms; at the directory rate above, generating its "
        f"policy would take about {len(installed) / rate:.0f} s (extrapolated, "
        f"not measured: it depends on the packages' sizes)"
    )


if __name__ == "__main__":
    main()
