#!/usr/bin/env python3
"""Verifier throughput against an emulated fleet, and memory per node.

Starts the real registrar and verifier (separate processes, SQLite, mTLS)
and the fleet emulator (verifier/testing/fleet.py, another process: N
agents on software TPMs with ECC P-256 AKs, registered and activated
through the registrar). Enrols every node with a PCR policy, waits until
all are attested (V released), then runs the verifier at quote interval 0
and counts full checks per second (HTTPS request over a kept-alive mTLS
connection, signature, nonce, PCR digest and policy, clock), from the
verifier's own counters. Also prints the CPU each process used and the
verifier's resident memory per enrolled node.

Not a test: nothing is asserted. Both processes share this machine's cores.

    .venv/bin/python tools/bench/fleet.py [--n 1000] [--window 10] [--uvloop]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))

import aiohttp  # noqa: E402

from verifier import tlsutil  # noqa: E402
from verifier.testing.cluster import LocalCluster, free_port  # noqa: E402


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Api:
    def __init__(self, cluster: LocalCluster) -> None:
        ctx = tlsutil.client_context(
            cluster.pki_file("tenant.pem"),
            cluster.pki_file("tenant-key.pem"),
            cluster.pki_file("ca.pem"),
        )
        self.base = cluster.verifier_url
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=ctx, limit=32)
        )

    async def stats(self) -> dict:  # type: ignore[type-arg]
        async with self.session.get(f"{self.base}/v1/stats") as resp:
            return dict(await resp.json())

    async def enrol(self, uuids: list[str], pcr16: str) -> None:
        policy = {"pcrs": {"16": [pcr16]}}
        semaphore = asyncio.Semaphore(32)

        async def one(uuid: str) -> None:
            body = {
                "uuid": uuid,
                "v": base64.b64encode(os.urandom(32)).decode(),
                "policy": policy,
            }
            async with (
                semaphore,
                self.session.post(f"{self.base}/v1/nodes", json=body) as resp,
            ):
                if resp.status != 201:
                    raise RuntimeError(f"enrol {uuid}: {await resp.text()}")

        await asyncio.gather(*(one(u) for u in uuids))


async def measure(
    cluster: LocalCluster,
    fleet_pid: int,
    ready: dict,  # type: ignore[type-arg]
    window: float,
) -> dict[str, float]:
    api = Api(cluster)
    verifier_pid = cluster.procs["verifier"].pid
    try:
        rss_before = rss_kib(verifier_pid)
        t0 = time.monotonic()
        await api.enrol(ready["uuids"], ready["pcr16"])
        n = len(ready["uuids"])
        while (await api.stats())["states"]["attested"] < n:
            if time.monotonic() - t0 > 600:
                raise RuntimeError(f"not all attested: {await api.stats()}")
            await asyncio.sleep(0.5)
        enrol_s = time.monotonic() - t0
        await asyncio.sleep(2)  # steady state
        q0, v0, f0 = (
            (await api.stats())["quotes_verified"],
            cpu_seconds(verifier_pid),
            cpu_seconds(fleet_pid),
        )
        t1 = time.monotonic()
        await asyncio.sleep(window)
        q1, v1, f1 = (
            (await api.stats())["quotes_verified"],
            cpu_seconds(verifier_pid),
            cpu_seconds(fleet_pid),
        )
        elapsed = time.monotonic() - t1
        stats = await api.stats()
        return {
            "rate": (q1 - q0) / elapsed,
            "verifier_cpu": (v1 - v0) / elapsed,
            "fleet_cpu": (f1 - f0) / elapsed,
            "enrol_s": enrol_s,
            "rss_per_node": (rss_kib(verifier_pid) - rss_before) * 1024 / n,
            "rss": rss_kib(verifier_pid) / 1024,
            "revoked": stats["states"]["revoked"],
            "failed": stats["states"]["failed"],
        }
    finally:
        await api.session.close()


def run(n: int, window: float, use_uvloop: bool, in_flight: int) -> dict[str, float]:
    workdir = tempfile.mkdtemp(prefix="bench-fleet-")
    cluster = LocalCluster(
        os.path.join(workdir, "cluster"),
        nodes=0,
        interval=0.0,
        notifiers=("noop",),
        verifier_options={"max_in_flight": in_flight, "max_unreachable": 1000},
    )
    fleet = None
    try:
        cluster.start()
        ready_file = os.path.join(workdir, "fleet-ready.json")
        cmd = [
            sys.executable,
            "-m",
            "verifier.testing.fleet",
            "--n",
            str(n),
            "--port",
            str(free_port()),
            "--registrar",
            cluster.registrar_url,
            "--pki",
            cluster.pki,
            "--workdir",
            workdir,
            "--ready-file",
            ready_file,
        ]
        if use_uvloop:
            cmd.append("--uvloop")
        with open(os.path.join(workdir, "fleet.log"), "wb") as log:
            fleet = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 600
        while not os.path.exists(ready_file):
            if fleet.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"fleet emulator failed; see {workdir}/fleet.log")
            time.sleep(0.2)
        with open(ready_file, encoding="utf-8") as f:
            ready = json.load(f)
        return asyncio.run(measure(cluster, fleet.pid, ready, window))
    finally:
        if fleet is not None:
            fleet.terminate()
            fleet.wait(10)
        cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[1000])
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--in-flight", type=int, default=512)
    parser.add_argument(
        "--uvloop", action="store_true", help="run the emulator on uvloop"
    )
    args = parser.parse_args()
    print(
        f"verifier vs emulated fleet, interval 0, {args.window:g} s window, "
        f"{os.cpu_count()} cores shared by verifier and emulator"
    )
    print(
        f"{'N':>7} {'checks/s':>9} {'verifier CPU':>13} {'emulator CPU':>13} "
        f"{'enrol+bootstrap':>16} {'RSS/node':>9}"
    )
    for n in args.n:
        r = run(n, args.window, args.uvloop, args.in_flight)
        print(
            f"{n:>7} {r['rate']:>9.0f} {r['verifier_cpu']:>12.2f}c "
            f"{r['fleet_cpu']:>12.2f}c {r['enrol_s']:>15.1f}s "
            f"{r['rss_per_node'] / 1024:>7.1f}KB"
            + (
                f"  (revoked {r['revoked']:.0f}, failed {r['failed']:.0f})"
                if r["revoked"] or r["failed"]
                else ""
            )
        )


if __name__ == "__main__":
    main()
