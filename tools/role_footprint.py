#!/usr/bin/env python3
"""What each role installs: packages and megabytes, per extra.

Builds the wheel of the checkout, installs it in a fresh venv once per
role (``pip install 'WHEEL[agent]'``, ...) and prints, for each, the number
of installed distributions (``pip list`` minus pip, setuptools and wheel)
and the size of the venv's site-packages (``du -sm``). With ``--before
REF`` it first does the same for the project as of REF without extras
(before setup.cfg had extras, every role installed all of
requirements.txt). Not a test: it takes a few minutes (pip's cache makes
reruns faster) and prints figures; doc/source/install.rst shows them.

    .venv/bin/python tools/role_footprint.py --before 9ac70cd
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: (label, extras) measured after; "" is the base alone.
ROLES = [
    ("base", ""),
    ("agent", "agent"),
    ("client", "client"),
    ("server", "server"),
    ("server at scale", "server,messaging,scale,postgresql"),
    ("hooks", "hooks"),
    ("hooks, all actions", "hooks,messaging,vault,ipsec"),
    ("vtpm", "vtpm"),
]
NOT_COUNTED = {"pip", "setuptools", "wheel"}


def _run(argv: list[str], **kw: object) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, **kw)  # type: ignore[call-overload]
    if proc.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed:\n{proc.stderr[-3000:]}")
    return str(proc.stdout)


def build_wheel(source: str, dest: str, env: dict[str, str] | None = None) -> str:
    """The wheel of ``source`` (a checkout or an exported tree), built in
    ``dest`` rather than in the source's ``build/`` (whose stale files would
    be shipped)."""
    os.makedirs(dest)
    config = os.path.join(dest, "build.cfg")
    with open(config, "w", encoding="utf-8") as f:
        f.write(f"[build]\nbuild_base = {os.path.join(dest, 'build')}\n")
    _run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", dest, source],
        env={**os.environ, "DIST_EXTRA_CONFIG": config, **(env or {})},
    )
    [name] = [n for n in os.listdir(dest) if n.endswith(".whl")]
    return os.path.join(dest, name)


def export(ref: str, dest: str) -> str:
    """The tree of ``ref`` (git archive), outside any worktree."""
    archive = os.path.join(dest, "src.tar")
    _run(["git", "-C", ROOT, "archive", "--format=tar", "-o", archive, ref])
    tree = os.path.join(dest, "src")
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree


def measure(requirement: str, workdir: str) -> tuple[int, int, float]:
    """(distributions, MB of site-packages, seconds) of a fresh venv with
    ``requirement`` installed."""
    venv = tempfile.mkdtemp(prefix="venv-", dir=workdir)
    started = time.monotonic()
    _run([sys.executable, "-m", "venv", venv])
    python = os.path.join(venv, "bin", "python")
    _run([python, "-m", "pip", "install", "-q", requirement])
    seconds = time.monotonic() - started
    listing = _run([python, "-m", "pip", "list", "--format", "json"])
    names = {item["name"].lower() for item in json.loads(listing)}
    site = _run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
    )
    megabytes = int(_run(["du", "-sm", site.strip()]).split()[0])
    shutil.rmtree(venv)
    return len(names - NOT_COUNTED), megabytes, seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--before", metavar="REF", help="also measure REF without extras"
    )
    parser.add_argument(
        "--roles",
        help="comma-separated labels to measure (default: all of "
        + ", ".join(label for label, _ in ROLES)
        + ")",
    )
    args = parser.parse_args()
    roles = ROLES
    if args.roles:
        wanted = set(args.roles.split(","))
        roles = [r for r in ROLES if r[0] in wanted]
        if not roles:
            print(f"role_footprint: error: no role among {args.roles}", file=sys.stderr)
            return 2
    rows: list[tuple[str, str, int, int, float]] = []
    with tempfile.TemporaryDirectory(prefix="role-footprint-") as tmp:
        if args.before:
            tree = export(args.before, tmp)
            # an exported tree has no git history: pbr takes the version given
            old = build_wheel(
                tree, os.path.join(tmp, "before"), {"PBR_VERSION": "0.0.0"}
            )
            rows.append((f"before ({args.before}), any role", "-", *measure(old, tmp)))
            print(rows[-1], file=sys.stderr)
        wheel = build_wheel(ROOT, os.path.join(tmp, "after"))
        for label, extras in roles:
            requirement = f"{wheel}[{extras}]" if extras else wheel
            rows.append((label, extras or "-", *measure(requirement, tmp)))
            print(rows[-1], file=sys.stderr)
    print(f"{'role':34} {'extras':36} {'packages':>8} {'MB':>5} {'install s':>9}")
    for label, extras, count, megabytes, seconds in rows:
        print(f"{label:34} {extras:36} {count:8d} {megabytes:5d} {seconds:9.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
