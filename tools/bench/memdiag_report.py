#!/usr/bin/env python3
"""Where a verifier's resident memory went: the samples of its memory
diagnostic (``TRUSTED_MEMDIAG_FILE``, :mod:`verifier.attest.memdiag`)
after a warm-up, each kind of memory with its first and last value, its
range and its least-squares slope per minute.

    TRUSTED_MEMDIAG_FILE=/tmp/mem.jsonl TRUSTED_MEMDIAG_INTERVAL=30 \\
        .venv/bin/python tools/bench/soak.py --n 5000 --minutes 18 --warmup 8
    .venv/bin/python tools/bench/memdiag_report.py /tmp/mem.jsonl --warmup 8

(The diagnostic's clock starts with the verifier, before the enrolment:
its warm-up counts from there, the soak's from the end of the enrolment.)

Kinds (MiB unless said): ``rss``; ``heap``, the main C heap's resident
pages; ``anon``, anonymous mappings (Python's object arenas, the other
malloc arenas, large blocks); ``anon-pymalloc``, the same without
Python's arenas; ``pymalloc`` arenas (1 MiB each); glibc's heap in use
(``malloc used``) and free but kept (``malloc free``, resident or not);
thousands of objects the garbage collector tracks (``gc objects``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from typing import Any

_KINDS: list[tuple[str, Callable[[dict[str, Any]], float]]] = [
    ("rss", lambda r: r["rss_kib"] / 1024),
    ("heap", lambda r: r["smaps"]["heap"] / 1024),
    ("anon", lambda r: r["smaps"]["anon"] / 1024),
    ("anon-pymalloc", lambda r: r["smaps"]["anon"] / 1024 - r["pymalloc"]["arenas"]),
    ("pymalloc", lambda r: float(r["pymalloc"]["arenas"])),
    ("malloc used", lambda r: r["mallinfo"]["used"] / 1024),
    ("malloc free", lambda r: r["mallinfo"]["free"] / 1024),
    ("gc objects", lambda r: r["gc_objects"] / 1000),
]


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (minutes, value) points, per minute."""
    if len(points) < 2:
        return 0.0
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    den = sum((x - mx) ** 2 for x, _ in points)
    num = sum((x - mx) * (y - my) for x, y in points)
    return num / den if den else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", help="the diagnostic's JSON lines")
    parser.add_argument("--warmup", type=float, default=0.0, help="minutes left out")
    args = parser.parse_args()
    try:
        with open(args.file, encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as exc:
        print(f"memdiag_report: cannot read {args.file}: {exc}", file=sys.stderr)
        return 2
    rows = [r for r in rows if r["t"] >= args.warmup * 60]
    if len(rows) < 2:
        print(
            "memdiag_report: fewer than two samples after the warm-up", file=sys.stderr
        )
        return 2
    first, last = rows[0]["t"] / 60, rows[-1]["t"] / 60
    print(f"{len(rows)} samples, minute {first:.1f} to {last:.1f}")
    print(f"{'':14s} {'first':>8s} {'last':>8s} {'min':>8s} {'max':>8s} {'/min':>8s}")
    for name, value in _KINDS:
        try:
            points = [(r["t"] / 60, value(r)) for r in rows]
        except (KeyError, TypeError):  # not sampled (not glibc)
            continue
        ys = [y for _, y in points]
        print(
            f"{name:14s} {ys[0]:8.1f} {ys[-1]:8.1f} {min(ys):8.1f} {max(ys):8.1f} "
            f"{slope(points):+8.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
