#!/usr/bin/env python3
"""A real fleet of N nodes on this machine, pull and push mixed, at
realistic intervals (issue 34, item 4): registration, enrolment,
attestation with tampering, memory per node and detection latency.

Starts the real registrar and verifier (separate processes, SQLite, mTLS,
the verifier's push endpoint on) and the fleet emulator
(trusted_testing/fleet.py: N agents on software TPMs with ECC P-256 AKs,
every ``--push-every``-th of them pushing its evidence, the others
polled). Then:

1. registration: every agent registers and activates its AK at the
   registrar (the emulator, 32 at a time);
2. enrolment: the tenant enrols the fleet in batches of ``--batch``
   (``POST /v1/nodes/batch``), each polled node with its own interval:
   ``--fast`` of all nodes every 2-10 s (connections kept), the rest
   every 60-300 s (closed after each round); push nodes post every 120 s, the verifier's
   quote interval (a push node has no interval of its own); then waits
   until every node is attested (V released);
3. attestation for ``--minutes``: every ``--tamper-every`` seconds one
   node's PCR 16 is extended, taking the three groups (fast pull, slow
   pull, push) in turn; each tampered node is watched until it is
   revoked, up to ``--grace`` seconds after the window.

Prints each phase's time and rate, the verifier's resident memory before
enrolment and after the window divided by N (its per-node cost with
connections and push sessions; the aim is <= 8 KB), detection latency
p50/p99/max per group, and judges: a tampered node not revoked is
missed, a revocation (or failed or unreachable event) of a node never
tampered with is false. Exit status 1 if any is. Not a test.

    .venv/bin/python tools/bench/scale.py --n 100000 [--minutes 10]
    .venv/bin/python tools/bench/scale.py --n 2000 --minutes 2 --tamper-every 5
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))

from trusted_testing.cluster import free_port  # noqa: E402
from trusted_testing.fleet import FleetProcess, pushing  # noqa: E402
from trusted_testing.fleet_run import (  # noqa: E402
    FAST,
    SLOW,
    FleetApi,
    fleet_cluster,
    keep_service_logs,
    running_fleet,
)
from trusted_testing.procstat import cpu_seconds, rss_kib  # noqa: E402

GROUPS = ("fast pull", "slow pull", "slow push")
#: The verifier's quote interval: that of the push nodes (seconds).
PUSH_INTERVAL = 120.0


def percentile(values: list[float], share: float) -> float:
    """The nearest-rank percentile of ``values`` (sorted or not)."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(share * len(ordered)) - 1))]


def _rounds(stats: dict[str, Any]) -> tuple[int, float]:
    """Polled rounds the verifier started and their summed lateness (s)."""
    classes = stats["classes"]
    rounds = sum(int(c["rounds"]) for c in classes)
    return rounds, sum(c["lag_mean"] * c["rounds"] for c in classes)


class ScaleRun:
    """One run against a started cluster and fleet."""

    def __init__(self, api: FleetApi, fleet: FleetProcess, pid: int, args: Any) -> None:
        self.api, self.fleet, self.pid, self.args = api, fleet, pid, args
        # push nodes are asked at the verifier's quote interval (the product
        # has no interval of their own for them): the slow class; the fast
        # share is taken from the polled nodes
        rng = random.Random(len(fleet.uuids))
        target = round(args.fast * len(fleet.uuids))
        self.intervals: dict[str, float] = {}
        self.group: dict[str, str] = {}
        for i, uuid in enumerate(fleet.uuids):
            if pushing(i, args.push_every):
                self.group[uuid] = "slow push"
            elif len(self.intervals) < target:
                self.intervals[uuid] = rng.uniform(*FAST)
                self.group[uuid] = "fast pull"
            else:
                self.intervals[uuid] = rng.uniform(*SLOW)
                self.group[uuid] = "slow pull"
        self.modes = {u: g.split()[1] for u, g in self.group.items()}
        self.tampered: dict[str, float] = {}
        self.detected: dict[str, float] = {}
        self.figures: dict[str, Any] = {}
        self.samples: list[dict[str, Any]] = []

    async def enrol(self) -> None:
        n = len(self.fleet.uuids)
        self.figures["rss_before_kib"] = rss_kib(self.pid)
        cpu0, t0 = cpu_seconds(self.pid), time.monotonic()
        await self.api.enrol(
            self.fleet.uuids,
            self.fleet.pcr16,
            intervals=self.intervals,
            batch=self.args.batch,
            modes=self.modes,
        )
        t1 = time.monotonic()
        await self.api.wait_attested(n, 7200)
        t2 = time.monotonic()
        self.figures.update(
            enrol_s=t1 - t0,
            attested_s=t2 - t0,
            enrol_cpu_ms=(cpu_seconds(self.pid) - cpu0) / n * 1000.0,
            rss_attested_kib=rss_kib(self.pid),
        )

    async def attest(self) -> None:
        """The window: tamper, watch, sample the verifier."""
        args = self.args
        self.figures["since"] = datetime.datetime.now(datetime.UTC).strftime(
            "%Y-%m-%dT%H:%M:%SZ"
        )
        rng = random.Random(34)
        pools = {g: [u for u, h in self.group.items() if h == g] for g in GROUPS}
        for pool in pools.values():
            rng.shuffle(pool)
        turn = [g for g in GROUPS if pools[g]]
        first = await self.api.stats()
        cpu0, t0 = cpu_seconds(self.pid), time.monotonic()
        end, next_tamper, k = t0 + args.minutes * 60, t0 + args.tamper_every, 0
        while time.monotonic() < end:
            if time.monotonic() >= next_tamper:
                pool = pools[turn[k % len(turn)]]
                k += 1
                if pool:
                    uuid = pool.pop()
                    await asyncio.to_thread(self.fleet.tamper, uuid)
                    self.tampered[uuid] = time.monotonic()
                next_tamper += args.tamper_every
            await self.watch(t0)
            await asyncio.sleep(args.poll)
        window_cpu = cpu_seconds(self.pid) - cpu0
        last = await self.api.stats()
        rounds, late = _rounds(last)
        rounds0, late0 = _rounds(first)
        self.figures.update(
            checks=last["quotes_verified"] - first["quotes_verified"],
            rounds=rounds - rounds0,
            lag_mean=(late - late0) / max(1, rounds - rounds0),
            lag_max=max((c["lag_max"] for c in last["classes"]), default=0.0),
        )
        self.figures.update(
            window_s=time.monotonic() - t0,
            window_cpu_s=window_cpu,
            rss_window_kib=rss_kib(self.pid),
        )
        settle = time.monotonic() + args.grace
        while time.monotonic() < settle and len(self.detected) < len(self.tampered):
            await self.watch(t0)
            await asyncio.sleep(args.poll)

    async def watch(self, t0: float) -> None:
        now = time.monotonic()
        for uuid in [u for u in self.tampered if u not in self.detected]:
            if (await self.api.node(uuid))["state"] == "revoked":
                self.detected[uuid] = now - self.tampered[uuid]
        if not self.samples or now - self.samples[-1]["t"] >= 30:
            stats = await self.api.stats()
            self.samples.append(
                {"t": now, "rss_kib": rss_kib(self.pid), "states": stats["states"]}
            )

    async def judge(self) -> tuple[list[str], list[str], dict[str, int]]:
        """(missed, false, events by kind) after the window."""
        since = self.figures["since"]
        missed = sorted(set(self.tampered) - set(self.detected))
        false: set[str] = set()
        counts: dict[str, int] = {}
        for kind in ("revoked", "failed", "unreachable"):
            events = await self.api.events(kind, since)
            counts[kind] = len(events)
            false.update(
                e["node_uuid"] for e in events if e["node_uuid"] not in self.tampered
            )
        return missed, sorted(false), counts

    def report(
        self, missed: list[str], false: list[str], counts: dict[str, int]
    ) -> int:
        f, n, args = self.figures, len(self.fleet.uuids), self.args
        sizes = {g: sum(1 for h in self.group.values() if h == g) for g in GROUPS}
        print(
            f"\nfleet of {n} nodes: {sizes['fast pull']} polled every "
            f"{FAST[0]:g}-{FAST[1]:g} s, {sizes['slow pull']} polled every "
            f"{SLOW[0]:g}-{SLOW[1]:g} s, {sizes['slow push']} pushing every "
            f"{PUSH_INTERVAL:g} s"
        )
        reg = self.fleet.register_s
        print(f"registration          {reg:8.0f} s  {n / max(reg, 1e-9):6.0f} nodes/s")
        print(
            f"enrolment             {f['enrol_s']:8.0f} s  "
            f"{n / f['enrol_s']:6.0f} nodes/s "
            f"(batches of {args.batch})"
        )
        print(
            f"enrolled to attested  {f['attested_s']:8.0f} s  "
            f"{n / f['attested_s']:6.0f} nodes/s; "
            f"verifier {f['enrol_cpu_ms']:.2f} ms CPU/node"
        )
        print(
            f"attestation window    {f['window_s']:8.0f} s  verifier CPU "
            f"{f['window_cpu_s'] / f['window_s'] * 100:.0f} % of a core"
        )
        print(
            f"checks in the window  {f['checks']} "
            f"({f['checks'] / f['window_s']:.0f}/s, pushed evidence included); "
            "polled rounds started "
            f"{f['rounds'] / f['window_s']:.0f}/s, "
            f"{f['lag_mean']:.1f} s late on average "
            f"(at most {f['lag_max']:.0f} s since the start)"
        )
        before, attested, after = (
            f["rss_before_kib"],
            f["rss_attested_kib"],
            f["rss_window_kib"],
        )
        print(
            f"verifier RSS          {before / 1024:.0f} MiB before enrolment, "
            f"{attested / 1024:.0f} MiB all attested, "
            f"{after / 1024:.0f} MiB after the window"
        )
        print(
            f"memory per node       {(after - before) / n:.2f} KiB "
            f"(after the window, connections and push sessions included; aim <= 8 KB)"
        )
        print(f"tampered              {len(self.tampered)}")
        print(f"revoked (detected)    {len(self.detected)}")
        print(f"missed                {len(missed)}")
        print(
            f"false                 {len(false)}  (events since the window: {counts})"
        )
        print(f"{'group':<12} {'tampered':>8} {'p50 s':>7} {'p99 s':>7} {'max s':>7}")
        for group in GROUPS:
            lat = [s for u, s in self.detected.items() if self.group[u] == group]
            hit = sum(1 for u in self.tampered if self.group[u] == group)
            if not lat:
                print(f"{group:<12} {hit:>8} {'-':>7} {'-':>7} {'-':>7}")
                continue
            print(
                f"{group:<12} {hit:>8} {statistics.median(lat):>7.1f} "
                f"{percentile(lat, 0.99):>7.1f} {max(lat):>7.1f}"
            )
        for uuid in missed[:5] + false[:5]:
            print(f"  {uuid} ({self.group.get(uuid, '?')})")
        return 1 if missed or false else 0


async def _main(args: argparse.Namespace) -> int:
    workdir = tempfile.mkdtemp(prefix="bench-scale-")
    push_port = free_port()
    # a polled node's own interval governs; push nodes take the verifier's
    cluster = fleet_cluster(
        workdir, PUSH_INTERVAL, {"max_in_flight": args.in_flight}, push_port=push_port
    )
    push_url = f"https://127.0.0.1:{push_port}"
    try:
        with running_fleet(
            cluster, args.n, workdir, True, 4 * 3600, push_url, None, args.push_every
        ) as fleet:
            api = FleetApi(cluster, cluster.verifier_urls[0])
            run = ScaleRun(
                api, fleet, cluster.procs[cluster.verifier_name(0)].pid, args
            )
            try:
                await run.enrol()
                await run.attest()
                return run.report(*await run.judge())
            finally:
                await api.close()
    finally:
        if args.keep_logs:  # the services' logs outlive the run's directory
            keep_service_logs(workdir, args.keep_logs)
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--tamper-every", type=float, default=6.0)
    parser.add_argument("--grace", type=float, default=420.0)
    parser.add_argument("--poll", type=float, default=1.0)
    parser.add_argument("--fast", type=float, default=0.1, help="share every 2-10 s")
    parser.add_argument(
        "--push-every", type=int, default=10, help="every K-th node pushes"
    )
    parser.add_argument("--batch", type=int, default=500, help="nodes per enrolment")
    parser.add_argument("--in-flight", type=int, default=512)
    parser.add_argument("--keep-logs", metavar="DIR", default="")
    return asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
