#!/usr/bin/env python3
"""Soak: a large emulated fleet attested for a bounded time, one node
tampered with every ``--tamper-every`` seconds.

Starts the real registrar and verifier (separate processes, SQLite, mTLS)
and the fleet emulator (trusted_testing/fleet.py: N agents on software
TPMs, registered and activated through the registrar), enrols every node
with a PCR 16 policy, waits until all are attested, then for ``--minutes``
extends PCR 16 of one random node every ``--tamper-every`` seconds and
watches the verifier's node list. Prints, and judges:

* false revocations: nodes revoked (or failed) that were never tampered
  with (want 0);
* missed: tampered nodes not revoked within ``--grace`` seconds (want 0);
* detection latency (max and median), checks per second;
* the verifier's resident memory at start and end and its slope (least
  squares over the run, KiB per minute); with ``--warmup W`` also its
  resident memory at minute W and the slope after minute W only (the
  start-up's growth left out).

Exit status 1 when a revocation is false or missed. Not a unit test: the
figures of the issue come from ``--n 10000 --minutes 30``; a CI form is
``--n 300 --minutes 3 --tamper-every 20``.

    .venv/bin/python tools/bench/soak.py [--n 10000] [--minutes 30]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))

from trusted_testing.fleet import FleetProcess  # noqa: E402
from trusted_testing.fleet_run import (  # noqa: E402
    FleetApi,
    fleet_cluster,
    keep_service_logs,
    running_fleet,
)
from trusted_testing.procstat import rss_kib  # noqa: E402


def slope_per_minute(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, KiB) samples, in KiB per minute."""
    if len(samples) < 2:
        return 0.0
    xs = [t for t, _ in samples]
    ys = [v for _, v in samples]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    if den == 0:
        return 0.0
    return 60.0 * sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den


class Soak:
    """One soak run against a started cluster and fleet."""

    def __init__(self, api: FleetApi, fleet: FleetProcess, pid: int) -> None:
        self.api = api
        self.fleet = fleet
        self.pid = pid
        self.tampered: dict[str, float] = {}
        self.detected: dict[str, float] = {}
        self.false: set[str] = set()
        self.rss: list[tuple[float, float]] = []

    async def enrol(self) -> float:
        t0 = time.monotonic()
        await self.api.enrol(self.fleet.uuids, self.fleet.pcr16)
        await self.api.wait_attested(len(self.fleet.uuids), 3600)
        return time.monotonic() - t0

    async def observe(self, t0: float) -> None:
        now = time.monotonic()
        for node in await self.api.nodes():
            if node["state"] not in ("revoked", "failed", "unreachable"):
                continue
            uuid = node["uuid"]
            if uuid not in self.tampered or node["state"] != "revoked":
                self.false.add(uuid)
            elif uuid not in self.detected:
                self.detected[uuid] = now - self.tampered[uuid]
        self.rss.append((now - t0, float(rss_kib(self.pid))))

    async def run(
        self, minutes: float, every: float, grace: float, poll: float
    ) -> None:
        t0 = time.monotonic()
        end = t0 + minutes * 60
        next_tamper = t0 + every
        rng = random.Random(18)
        pool = list(self.fleet.uuids)
        rng.shuffle(pool)
        while time.monotonic() < end:
            if time.monotonic() >= next_tamper and pool:
                uuid = pool.pop()
                await asyncio.to_thread(self.fleet.tamper, uuid)
                self.tampered[uuid] = time.monotonic()
                next_tamper += every
            await self.observe(t0)
            await asyncio.sleep(poll)
        settle = time.monotonic() + grace
        while time.monotonic() < settle and len(self.detected) < len(self.tampered):
            await self.observe(t0)
            await asyncio.sleep(poll)

    def report(
        self, n: int, minutes: float, interval: float, enrol_s: float, warmup: float
    ) -> int:
        missed = sorted(set(self.tampered) - set(self.detected))
        latencies = sorted(self.detected.values())
        print(f"nodes                 {n}")
        print(f"soak                  {minutes:g} min, quote interval {interval:g} s")
        print(f"enrol+attest          {enrol_s:.0f} s")
        print(f"tampered              {len(self.tampered)}")
        print(f"revoked (detected)    {len(self.detected)}")
        print(f"missed                {len(missed)}")
        print(f"false revocations     {len(self.false)}")
        if latencies:
            print(
                f"detection latency     max {latencies[-1]:.1f} s, "
                f"median {statistics.median(latencies):.1f} s"
            )
        if self.rss:
            print(
                f"verifier RSS          {self.rss[0][1] / 1024:.0f} MiB -> "
                f"{self.rss[-1][1] / 1024:.0f} MiB, slope "
                f"{slope_per_minute(self.rss):+.1f} KiB/min"
            )
        after = [(t, v) for t, v in self.rss if t >= warmup * 60]
        if warmup and len(after) >= 2:
            print(
                f"after minute {warmup:<6g}   {after[0][1] / 1024:.0f} MiB -> "
                f"{after[-1][1] / 1024:.0f} MiB, slope "
                f"{slope_per_minute(after):+.1f} KiB/min"
            )
        return 1 if missed or self.false else 0


async def _main(args: argparse.Namespace) -> int:
    workdir = tempfile.mkdtemp(prefix="soak-")
    try:
        cluster = fleet_cluster(workdir, args.interval)
        with running_fleet(cluster, args.n, workdir) as fleet:
            api = FleetApi(cluster, cluster.verifier_urls[0])
            soak = Soak(api, fleet, cluster.procs[cluster.verifier_name(0)].pid)
            try:
                enrol_s = await soak.enrol()
                await soak.run(args.minutes, args.tamper_every, args.grace, args.poll)
                return soak.report(
                    args.n, args.minutes, args.interval, enrol_s, args.warmup
                )
            finally:
                await api.close()
    finally:
        if args.keep_logs:  # the services' logs outlive the run's directory
            keep_service_logs(workdir, args.keep_logs)
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--tamper-every", type=float, default=60.0)
    parser.add_argument("--interval", type=float, default=2.0, help="quote interval")
    parser.add_argument("--grace", type=float, default=60.0)
    parser.add_argument("--poll", type=float, default=2.0)
    parser.add_argument(
        "--warmup",
        type=float,
        default=0.0,
        help="minutes left out of a second RSS slope (0: none)",
    )
    parser.add_argument(
        "--keep-logs",
        metavar="DIR",
        default="",
        help="copy the services' logs here at the end (the run's directory goes)",
    )
    return asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
