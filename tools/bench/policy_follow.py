#!/usr/bin/env python3
"""Time and CPU until N following nodes judge with a new policy version
(issue 28, "Speed").

Fills a verifier database with N enrolled, attested nodes of one project
that follow the runtime policy ``web`` (every node mid-replay: an IMA
count and PCR 10 state of its own), starts the real ``Verifier`` service
on it in this process (every node loaded into the live map; an agent
client that never answers, and the quote loop paused, so nothing but the
switch runs), then adds versions 2, 3, ... of ``web`` as the policy API
does (``PolicyStore.add`` on a worker thread, then
``PolicySwitch.new_version``) and measures, from the add to every live
node holding the new version's digest (each node's row switched and one
signed ``node.policy_changed`` event per node committed with it):

* wall time and process CPU time (all threads), median of ``--runs``;
* of which the store's add (parse, digest, insert) and the switch.

    .venv/bin/python tools/bench/policy_follow.py [--n 10000] [--paths 5000]
        [--runs 5] [--url sqlite:///... | --postgres]

(``--postgres``: a scratch database on the local PostgreSQL, dropped after.)
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))


from trusted_testing.bench_nodes import attested_row, ecc_ak, silent_verifier  # noqa: E402
from verifier import db  # noqa: E402
from verifier.attest.policies import PolicyStore  # noqa: E402

PROJECT = "bench"


def policy(version: int, paths: int) -> dict[str, Any]:
    """Runtime policy ``web`` at ``version``: ``paths`` files, and one more
    per version (what a patch adds)."""
    digests = {
        f"/usr/lib/web/{i:06d}.so": [
            "sha256:" + hashlib.sha256(f"{i}".encode()).hexdigest()
        ]
        for i in range(paths)
    }
    for v in range(2, version + 1):
        digest = hashlib.sha256(f"patch {v}".encode()).hexdigest()
        digests[f"/usr/bin/patched-{v}"] = [f"sha256:{digest}"]
    return {
        "name": "web",
        "version": version,
        "digests": digests,
        "excludes": [],
        "keys": [],
        "ima_buf": {},
    }


def fill(url: str, n: int, paths: int) -> None:
    """N attested nodes following ``web`` version 1."""
    engine = db.make_engine(url)
    db.upgrade(engine)
    meta, _ = PolicyStore(engine).add("runtime", policy(1, paths), project=PROJECT)
    pcr_policy = json.dumps({"hash": "sha256", "pcrs": {}})
    ak = ecc_ak()
    now = time.time()
    rows = [
        attested_row(
            i,
            pcr_policy,
            ak,
            now,
            project_id=PROJECT,
            runtime_policy=meta["digest"],
            runtime_policy_follow="web",
            ima_count=100 + i % 50,
            ima_pcr=os.urandom(52),
        )
        for i in range(n)
    ]
    with engine.begin() as conn:
        conn.execute(db.Node.__table__.insert(), rows)
    engine.dispose()


async def measure(url: str, n: int, paths: int, runs: int) -> list[dict[str, float]]:
    engine = db.make_engine(url)
    verifier = silent_verifier(engine, 60.0)
    await verifier.start()
    verifier.pause_attestation()
    assert len(verifier.nodes) == n, len(verifier.nodes)
    out = []
    try:
        for version in range(2, runs + 2):
            document = policy(version, paths)
            wall0, cpu0 = time.perf_counter(), time.process_time()
            meta, new = await asyncio.to_thread(
                verifier.policies.add, "runtime", document, None, None, PROJECT
            )
            wall1, cpu1 = time.perf_counter(), time.process_time()
            switched = await verifier.switch.new_version("runtime", PROJECT, "web")
            wall2, cpu2 = time.perf_counter(), time.process_time()
            assert new and switched == n, (new, switched)
            digest = meta["digest"]
            held = sum(1 for node in verifier.nodes if node.runtime_ref == digest)
            assert held == n, held
            out.append(
                {
                    "wall": wall2 - wall0,
                    "cpu": cpu2 - cpu0,
                    "add_wall": wall1 - wall0,
                    "switch_wall": wall2 - wall1,
                    "switch_cpu": cpu2 - cpu1,
                }
            )
    finally:
        await verifier.stop()
        engine.dispose()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10000, help="following nodes")
    parser.add_argument("--paths", type=int, default=5000, help="policy size")
    parser.add_argument("--runs", type=int, default=5, help="new versions added")
    parser.add_argument("--url", help="database URL (default: a fresh SQLite file)")
    parser.add_argument(
        "--postgres", action="store_true", help="a scratch local PostgreSQL database"
    )
    args = parser.parse_args()
    url, scratch = args.url, None
    if args.postgres:
        from trusted_testing import services

        url, scratch = services.scratch_postgres()
    elif url is None:
        workdir = tempfile.mkdtemp(prefix="bench-policy-follow-")
        url = f"sqlite:///{workdir}/verifier.sqlite"
    try:
        fill(url, args.n, args.paths)
        results = asyncio.run(measure(url, args.n, args.paths, args.runs))
    finally:
        if scratch is not None:
            services.drop_postgres(scratch)

    def med(key: str) -> float:
        return statistics.median(r[key] for r in results)

    dialect = url.split(":", 1)[0].split("+", 1)[0]
    print(
        f"{args.n} nodes following runtime policy 'web' ({args.paths} paths), "
        f"{dialect}, median of {len(results)} new versions:"
    )
    print(
        f"  add to every live node holding it: {med('wall'):.3f} s wall, "
        f"{med('cpu'):.3f} s CPU"
    )
    print(f"    store the version:  {med('add_wall'):.3f} s wall")
    print(
        f"    switch the nodes:   {med('switch_wall'):.3f} s wall, "
        f"{med('switch_cpu'):.3f} s CPU "
        f"({med('switch_wall') / args.n * 1e6:.0f} us per node, with its "
        "signed event)"
    )


if __name__ == "__main__":
    main()
