#!/usr/bin/env python3
"""Bootstrap latency on real swtpm TPMs, and the verifier's CPU per quote.

Starts a real deployment (registrar, verifier, N agents each on its own
swtpm, SQLite, mTLS; see trusted_testing/cluster.py), waits until every
agent has registered and activated its AK, then enrols the nodes one at a
time with the tenant library and measures, per node, from the start of the
enrolment (node registered, tenant begins) to the moment the agent wrote
the decrypted payload: the tenant's identity quote, V to the verifier, U to
the node, the verifier's first integrity quote, V to the node, decryption.

Then it lets the verifier attest all nodes for a window and divides the
verifier process's CPU time (user + system, from /proc) by the quotes it
verified in that window.

Prints median and p99. Not a test: nothing is asserted.

    .venv/bin/python tools/bench/bootstrap.py [--nodes 20] [--ak ecc|rsa]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))

from nova_plugin.exceptions import TenantError  # noqa: E402
from nova_plugin.tenant import Tenant  # noqa: E402
from trusted_testing.cluster import PCR, LocalCluster  # noqa: E402
from trusted_testing.procstat import cpu_seconds  # noqa: E402
from verifier.protocol import PcrPolicy  # noqa: E402

PAYLOAD = b"#!/bin/sh\necho ok\n"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


async def enrol_all(cluster: LocalCluster, tenant: Tenant) -> list[float]:
    policy = PcrPolicy.from_dict({"pcrs": {str(PCR): [cluster.good_pcr_hex()]}})
    latencies = []
    for node in cluster.nodes:
        payload = os.path.join(node.work_dir, "payload")
        t0 = time.time()
        await tenant.enrol(node.uuid, PAYLOAD, policy)
        while not os.path.exists(payload):
            await asyncio.sleep(0.001)
        latencies.append(os.stat(payload).st_mtime - t0)
    return latencies


async def quotes_verified(tenant: Tenant) -> int:
    return sum(int(n["quotes_verified"]) for n in await tenant.nodes())


async def measure(cluster: LocalCluster, window: float) -> tuple[list[float], float]:
    tenant = cluster.tenant()
    try:
        deadline = time.monotonic() + 180
        for node in cluster.nodes:
            while True:
                try:
                    await tenant.identity(node.uuid)
                    break
                except TenantError:  # not registered yet
                    if time.monotonic() > deadline:
                        raise SystemExit(
                            f"agent {node.index} did not register; see {node.log}"
                        )
                    await asyncio.sleep(0.1)
        latencies = await enrol_all(cluster, tenant)
        pid = cluster.procs["verifier"].pid
        q0, c0 = await quotes_verified(tenant), cpu_seconds(pid)
        await asyncio.sleep(window)
        q1, c1 = await quotes_verified(tenant), cpu_seconds(pid)
        cpu_per_quote = (c1 - c0) / max(1, q1 - q0)
        return latencies, cpu_per_quote
    finally:
        await tenant.close()


def _exit_on_sigterm() -> None:
    # turn SIGTERM (e.g. from timeout) into SystemExit, so that the
    # clean-up in finally blocks and atexit stops every process started
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def main() -> None:
    _exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--ak", choices=("ecc", "rsa"), default="ecc")
    parser.add_argument(
        "--interval",
        type=float,
        default=0.5,
        help="verifier quote interval during the CPU window",
    )
    parser.add_argument("--window", type=float, default=10.0)
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="bench-bootstrap-")
    cluster = LocalCluster(
        workdir,
        nodes=args.nodes,
        interval=args.interval,
        ak_alg=args.ak,
        notifiers=("noop",),
        log_level="WARNING",
    )
    try:
        cluster.start()
        latencies, cpu = asyncio.run(measure(cluster, args.window))
    finally:
        cluster.stop()
    ms = [x * 1000 for x in latencies]
    print(
        f"bootstrap on swtpm, {args.nodes} nodes, {args.ak.upper()} AK, "
        "enrolment start -> payload decrypted:"
    )
    print(
        f"  p50 {statistics.median(ms):.1f} ms   p99 {percentile(ms, 99):.1f} ms   "
        f"min {min(ms):.1f} ms   max {max(ms):.1f} ms"
    )
    print(
        f"verifier CPU per quote check (whole process, HTTPS + verify + "
        f"bookkeeping, {args.window:g} s window): {cpu * 1e6:.0f} us"
    )


if __name__ == "__main__":
    main()
