#!/usr/bin/env python3
"""Boot storms: how fast a fleet registers, enrols and receives V, and
where the CPU goes (issue 34, item 3).

Starts the real registrar and verifier (separate processes, SQLite, mTLS)
and the fleet emulator (trusted_testing/fleet.py: N agents on software
TPMs with ECC P-256 AKs). Three phases, each timed on the wall clock and
by the CPU each process spent in it:

* registration: every agent registers and activates its AK at the
  registrar (32 at a time, as the emulator does);
* enrolment: the tenant posts every node to the verifier (32 requests at
  a time, the fleet's tenant, which asks again on 502-504), or with
  ``--batch K`` in batch enrolments of K nodes (``POST /v1/nodes/batch``,
  two at a time);
* bootstrap: until the verifier has quoted every node once and released
  V to it (every node ``attested``).

Prints nodes per second and CPU milliseconds per node of the registrar,
the verifier and the emulator in each phase, with one ECDSA P-256
verification measured in the same run (the floor of a check). With
``--profile`` the registrar and the verifier run under cProfile
(``TRUSTED_CPU_PROFILE_DIR``, :mod:`verifier.common.cpuprofile`) and the
functions that took most of each one's event-loop CPU are printed after
the run (profiling slows both: read the shares, not the rates).

Not a test: nothing is asserted.

    .venv/bin/python tools/bench/storm.py [--n 1000] [--batch 500]
        [--profile [DIR]] [--top 25]
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import io
import os
import pstats
import shutil
import signal
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))

from trusted_testing.fleet_run import (  # noqa: E402
    FleetApi,
    fleet_cluster,
    running_fleet,
)
from trusted_testing.procstat import cpu_seconds, ecdsa_floor  # noqa: E402
from verifier.common.cpuprofile import ENV as PROFILE_ENV  # noqa: E402

PROCESSES = ("registrar", "verifier", "fleet")


def _cpu(pids: dict[str, int]) -> dict[str, float]:
    return {name: cpu_seconds(pid) for name, pid in pids.items()}


def _phase(
    name: str, seconds: float, n: int, before: dict[str, float], after: dict[str, float]
) -> dict[str, Any]:
    row: dict[str, Any] = {"phase": name, "s": seconds, "rate": n / max(seconds, 1e-9)}
    for proc in PROCESSES:
        row[proc] = (after[proc] - before[proc]) / n * 1000.0  # ms per node
    return row


async def _storm(cluster: Any, fleet: Any, n: int, batch: int) -> list[dict[str, Any]]:
    api = FleetApi(cluster, cluster.verifier_urls[0])
    pids = {
        "registrar": cluster.procs["registrar"].pid,
        "verifier": cluster.procs[cluster.verifier_name(0)].pid,
        "fleet": fleet.proc.pid,
    }
    try:
        c0, t0 = _cpu(pids), time.monotonic()
        await api.enrol(fleet.uuids, fleet.pcr16, batch=batch)
        c1, t1 = _cpu(pids), time.monotonic()
        await api.wait_attested(n, 600 + n / 20)
        c2, t2 = _cpu(pids), time.monotonic()
    finally:
        await api.close()
    return [
        _phase("enrolment", t1 - t0, n, c0, c1),
        _phase("bootstrap", t2 - t1, n, c1, c2),
        _phase("enrol+bootstrap", t2 - t0, n, c0, c2),
    ]


def run(
    n: int, profile_dir: str | None, batch: int = 0
) -> tuple[list[dict[str, Any]], float]:
    workdir = tempfile.mkdtemp(prefix="bench-storm-")
    if profile_dir:
        os.environ[PROFILE_ENV] = profile_dir
    # a realistic interval: the bootstrap is the first quote of each node,
    # the rounds after it are not part of the storm
    cluster = fleet_cluster(workdir, 30.0)
    try:
        registrar_cpu = 0.0
        with running_fleet(cluster, n, workdir) as fleet:
            registrar_cpu = cpu_seconds(cluster.procs["registrar"].pid)
            rows = asyncio.run(_storm(cluster, fleet, n, batch))
            register = {
                "phase": "registration",
                "s": fleet.register_s,
                "rate": n / max(fleet.register_s, 1e-9),
                # the registrar's CPU from its start: its start-up (a
                # second or so) is in it; the verifier is idle then
                "registrar": registrar_cpu / n * 1000.0,
                "verifier": float("nan"),
                "fleet": fleet.register_cpu_s / n * 1000.0,
            }
        return [register, *rows], registrar_cpu
    finally:
        os.environ.pop(PROFILE_ENV, None)
        if not os.environ.get("STORM_KEEP"):
            shutil.rmtree(workdir, ignore_errors=True)


def print_rows(
    n: int, rows: list[dict[str, Any]], floor_us: float, batch: int = 0
) -> None:
    how = f", enrolled in batches of {batch}" if batch else ", enrolled one by one"
    print(f"\nboot storm of {n} nodes (one registrar, one verifier, SQLite){how}")
    print(f"ECDSA P-256 verify in this run: {floor_us:.0f} us (the floor of a check)")
    head = f"{'phase':<16} {'seconds':>8} {'nodes/s':>8}"
    print(head + "".join(f" {p + ' ms/node':>19}" for p in PROCESSES))
    for r in rows:
        line = f"{r['phase']:<16} {r['s']:>8.1f} {r['rate']:>8.0f}"
        for proc in PROCESSES:
            value = r[proc]
            line += f" {'-' if value != value else f'{value:.2f}':>19}"
        print(line)


def print_profiles(directory: str, top: int) -> None:
    for prog in ("trusted-registrar", "trusted-verifier"):
        for path in sorted(glob.glob(os.path.join(directory, f"{prog}-*.pstats"))):
            out = io.StringIO()
            stats = pstats.Stats(path, stream=out)
            total = stats.total_tt  # type: ignore[attr-defined]
            print(f"\n{prog}: {total:.1f} s of event-loop CPU under cProfile")
            rows = []
            for (file, line, func), value in stats.stats.items():  # type: ignore[attr-defined]
                rows.append((value[2], value[3], file, line, func))
            rows.sort(reverse=True)
            print(f"{'own %':>6} {'with callees %':>15}  function")
            for own, cum, file, line, func in rows[:top]:
                where = file.replace(os.getcwd() + "/", "")
                if "site-packages/" in where:
                    where = where.split("site-packages/", 1)[1]
                print(
                    f"{own / total * 100:>6.1f} {cum / total * 100:>15.1f}  "
                    f"{where}:{line}({func})"
                )


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument(
        "--profile",
        nargs="?",
        const="",
        default=None,
        metavar="DIR",
        help="profile the registrar and verifier (keep the .pstats in DIR)",
    )
    parser.add_argument(
        "--batch",
        type=int,
        default=0,
        metavar="K",
        help="enrol in batches of K nodes (POST /v1/nodes/batch; 0: one by one)",
    )
    parser.add_argument("--top", type=int, default=25, help="rows of each profile")
    args = parser.parse_args()
    profile_dir = args.profile or None
    if args.profile == "":
        profile_dir = tempfile.mkdtemp(prefix="storm-profile-")
    try:
        rows, _ = run(args.n, profile_dir, args.batch)
        floor = ecdsa_floor()
        print_rows(args.n, rows, floor["verify_us"], args.batch)
        if profile_dir:
            print_profiles(profile_dir, args.top)
    finally:
        if profile_dir and not args.profile:
            shutil.rmtree(profile_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
