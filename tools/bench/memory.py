#!/usr/bin/env python3
"""Verifier memory per enrolled node (aim: <= 8 KB per node, issue 19).

Fills a verifier database with N enrolled, attested nodes (distinct ECC
P-256 AKs from software TPMs, one shared PCR policy as a real tenant would
use), then starts the real ``Verifier`` service on it in this process, with
an agent client whose requests never complete (so every node is loaded and
scheduled but no network traffic happens), and reports the growth of the
process's resident memory divided by N.

    .venv/bin/python tools/bench/memory.py [--n 10000 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))


from trusted_testing.bench_nodes import attested_row, ecc_ak, silent_verifier  # noqa: E402
from trusted_testing.procstat import rss_kib  # noqa: E402
from verifier import db  # noqa: E402


def fill(url: str, n: int) -> None:
    engine = db.make_engine(url)
    db.upgrade(engine)
    policy = json.dumps({"hash": "sha256", "pcrs": {"16": ["00" * 32]}})
    now = time.time()
    rows = [attested_row(i, policy, ecc_ak(), now) for i in range(n)]
    with engine.begin() as conn:
        conn.execute(db.Node.__table__.insert(), rows)
    engine.dispose()


async def measure(url: str, n: int) -> float:
    engine = db.make_engine(url)
    gc.collect()
    before = rss_kib()
    verifier = silent_verifier(engine, 2.0)
    await verifier.start()
    await asyncio.sleep(1)
    for node in verifier.nodes:
        node.ak.key  # noqa: B018 (what a verification builds)
    gc.collect()
    after = rss_kib()
    assert len(verifier.nodes) == n, len(verifier.nodes)
    await verifier.stop()
    return (after - before) * 1024 / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[10000])
    args = parser.parse_args()
    print(
        "verifier resident memory per enrolled node (all nodes loaded and "
        "scheduled, one shared policy)"
    )
    for n in args.n:
        workdir = tempfile.mkdtemp(prefix="bench-memory-")
        url = f"sqlite:///{workdir}/verifier.sqlite"
        fill(url, n)
        per_node = asyncio.run(measure(url, n))
        print(f"  {n:>7} nodes: {per_node / 1024:6.2f} KB per node")


if __name__ == "__main__":
    main()
