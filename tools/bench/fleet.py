#!/usr/bin/env python3
"""Verifier throughput against an emulated fleet, and memory per node.

Starts the real registrar and verifier (separate processes, SQLite, mTLS)
and the fleet emulator (trusted_testing/fleet.py, another process: N
agents on software TPMs with ECC P-256 AKs, registered and activated
through the registrar). Enrols every node with a PCR policy, waits until
all are attested (V released), then runs the verifier at quote interval 0
and counts full checks per second (HTTPS request over a kept-alive mTLS
connection, signature, nonce, PCR digest and policy, clock), from the
verifier's own counters. Also prints the CPU each process used and the
verifier's resident memory per enrolled node.

With ``--modes pull push`` the same run measures the fleet enrolled in
each attestation mode in turn: pull (the verifier polls every agent) and
push (every agent opens a TPM session and posts evidence to the
verifier's push endpoint, which judges it the same way), and prints both
rates and their ratio.

Not a test: nothing is asserted. Both processes share this machine's cores.

    .venv/bin/python tools/bench/fleet.py [--n 100 1000] [--window 10] [--verifiers 2]
    .venv/bin/python tools/bench/fleet.py --modes pull push --repeat 3
    .venv/bin/python tools/bench/fleet.py --n 2000 --in-flight 4096 \\
        --rtt 25 50 100 150
    .venv/bin/python tools/bench/fleet.py --n 1000 6000 --mix 0.1 --observe 75

Every row also gives CPU microseconds per check of the verifier(s) and of
the emulator (process CPU time over checks, which other load on the machine
barely changes) beside the CPU of one ECDSA P-256 verify measured in this
process in the same run, the floor of a check. ``--rtt`` then measures the
same deployment with the emulator holding every answer back by each
round-trip time in turn: at interval 0 a node has one quote in flight, so
the rate is bounded by min(N, in-flight)/RTT as well as by CPU.

``--ima K`` (issue 19, "IMA under load") measures, after each plain pull
row, a fresh deployment whose agents each keep an ima-ng measurement list
growing by K entries per quote (extended into PCR 10, served from the
index the verifier asks for, as the real agent does:
trusted_testing/fleet_ima.py), enrolled with one runtime policy of
``--ima-paths`` paths (100,000 by default) shared by every node, as a
tenant would; each check then also replays and judges K new entries. It
prints the IMA row beside the plain one and the revoked/failed counts
(every node must stay attested)::

    .venv/bin/python tools/bench/fleet.py --n 200 1000 --ima 100
``--mix SHARE`` enrols the fleet with realistic per-node intervals instead
of interval 0: SHARE of the nodes quoted every 2-10 s (their connections
kept alive between rounds) and the rest every 60-300 s (beyond
``agent_keep_alive``: disconnected after each round), runs it for
``--observe`` seconds (the verifier trims its heap once a minute) and
prints the verifier's resident memory per node including its connection
state, against the aim of issue 19 (<= 8 KB per node). With ``--modes
push`` the push nodes get the same intervals (told to their agents in the
answers), each agent on a connection of its own, kept up to 30 s idle as
the real agent's client keeps it::

    .venv/bin/python tools/bench/fleet.py --n 1000 6000 --mix 0.1 --modes pull push
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))

from trusted_testing import services  # noqa: E402
from trusted_testing.cluster import LocalCluster, free_port  # noqa: E402
from trusted_testing.fleet import FleetProcess  # noqa: E402
from trusted_testing.fleet_ima import ImaLoad, policy_document  # noqa: E402
from trusted_testing.fleet_run import (  # noqa: E402
    FleetApi,
    fleet_cluster,
    mix_text,
    mixed_intervals,
    push_mix_text,
    running_fleet,
)
from trusted_testing.procstat import (  # noqa: E402
    cpu_seconds,
    cpu_split,
    ecdsa_floor,  # noqa: E402
    rss_kib,
    sockets,
)


async def measure(
    cluster: LocalCluster,
    fleet: FleetProcess,
    window: float,
    mode: str = "pull",
    rtts: Sequence[float] = (),
    runtime_policy: dict[str, object] | None = None,
    mix: float | None = None,
    observe: float = 0.0,
) -> dict[str, float]:
    apis = [FleetApi(cluster, url) for url in cluster.verifier_urls]
    pids = [
        cluster.procs[cluster.verifier_name(i)].pid
        for i in range(len(cluster.verifier_urls))
    ]
    assert fleet.proc is not None
    fleet_pid = fleet.proc.pid

    async def quotes() -> int:
        return sum([(await api.stats())["quotes_verified"] for api in apis])

    def verifier_cpu() -> float:
        return sum(cpu_seconds(pid) for pid in pids)

    def verifier_sys() -> float:
        return sum(cpu_split(pid)[1] for pid in pids)

    try:
        rss_before = sum(rss_kib(pid) for pid in pids)
        policy_s, digest = 0.0, None
        if runtime_policy is not None:  # stored once, shared by every node
            t0 = time.monotonic()
            digest = await apis[0].add_runtime_policy(runtime_policy)
            policy_s = time.monotonic() - t0
        t0 = time.monotonic()
        intervals = None if mix is None else mixed_intervals(fleet.uuids, mix)
        await apis[0].enrol(fleet.uuids, fleet.pcr16, mode, digest, intervals)
        n = len(fleet.uuids)
        await apis[0].wait_attested(n, 600 + n / 50)
        enrol_s = time.monotonic() - t0
        await asyncio.sleep(max(2.0, observe))  # steady state

        async def window_figures(prefix: str) -> dict[str, float]:
            q0, v0, f0 = await quotes(), verifier_cpu(), cpu_seconds(fleet_pid)
            s0 = verifier_sys()
            t1 = time.monotonic()
            await asyncio.sleep(window)
            q1, v1, f1 = await quotes(), verifier_cpu(), cpu_seconds(fleet_pid)
            s1 = verifier_sys()
            elapsed, checks = time.monotonic() - t1, max(q1 - q0, 1)
            return {
                prefix + "rate": (q1 - q0) / elapsed,
                prefix + "verifier_cpu": (v1 - v0) / elapsed,
                prefix + "fleet_cpu": (f1 - f0) / elapsed,
                prefix + "verifier_us": (v1 - v0) / checks * 1e6,
                prefix + "verifier_sys_us": (s1 - s0) / checks * 1e6,
                prefix + "fleet_us": (f1 - f0) / checks * 1e6,
            }

        if len(apis) > 1:  # the same window, per process and per node
            figures = await split_window(apis, pids, fleet, window_figures)
        else:
            figures = await window_figures("")
        for rtt in rtts:
            await asyncio.to_thread(fleet.set_rtt, rtt)
            await asyncio.sleep(2 + 2 * rtt)  # the answers in flight land
            figures.update(await window_figures(f"rtt{rtt * 1000:g}_"))
        await asyncio.to_thread(fleet.set_rtt, 0)
        stats = await apis[0].stats()
        rss_after = sum(rss_kib(pid) for pid in pids)
        open_sockets = sum(sockets(pid) for pid in pids)
        floor = await asyncio.to_thread(ecdsa_floor)
        return {
            **figures,
            "sockets": open_sockets,
            "ecdsa_verify_us": floor["verify_us"],
            "ecdsa_sign_us": floor["sign_us"],
            "enrol_s": enrol_s,
            "policy_s": policy_s,
            "rss_per_node": (rss_after - rss_before) * 1024 / n,
            "rss": rss_after / 1024,
            "revoked": stats["states"]["revoked"],
            "failed": stats["states"]["failed"] + stats["states"]["unreachable"],
        }
    finally:
        for api in apis:
            await api.close()


async def split_window(
    apis: Sequence[FleetApi],
    pids: Sequence[int],
    fleet: FleetProcess,
    window_figures: Callable[[str], Awaitable[dict[str, float]]],
) -> dict[str, float]:
    """The window's figures, and how several verifier processes split it:
    each one's checks/s, CPU and nodes owned; the quotes each node answered
    (the emulator's counters). Every node quoted in the window, and the
    processes' owned nodes summing to the fleet, mean each node is quoted
    by exactly one process (a process quotes only the nodes it owns)."""

    async def stamped(ask: Awaitable[Any]) -> tuple[float, Any]:
        # the answer and when it came: under load a /v1/stats call can take
        # a second (it reads the database first, the counter last), which
        # would skew a per-process rate timed by the window
        answer = await ask
        return time.monotonic(), answer

    before = [
        (await stamped(api.stats()), cpu_seconds(pid))
        for api, pid in zip(apis, pids, strict=True)
    ]
    counts0 = await stamped(asyncio.to_thread(fleet.counters))
    figures = await window_figures("")
    counts1 = await stamped(asyncio.to_thread(fleet.counters))
    after = [
        (await stamped(api.stats()), cpu_seconds(pid))
        for api, pid in zip(apis, pids, strict=True)
    ]
    for i, (((t0, a), c0), ((t1, b), c1)) in enumerate(zip(before, after, strict=True)):
        checks = b["quotes_verified"] - a["quotes_verified"]
        figures[f"p{i}_owned"] = b["owned"]
        figures[f"p{i}_rate"] = checks / (t1 - t0)
        figures[f"p{i}_cpu"] = (c1 - c0) / (t1 - t0)
        figures[f"p{i}_us"] = (c1 - c0) / max(checks, 1) * 1e6
    per_node = [counts1[1][u] - counts0[1].get(u, 0) for u in fleet.uuids]
    figures["processes"] = len(apis)
    figures["owned_sum"] = sum(b["owned"] for (_, b), _ in after)
    figures["nodes_quoted"] = sum(1 for c in per_node if c > 0)
    figures["node_min"] = min(per_node)
    figures["node_median"] = statistics.median(per_node)
    figures["node_max"] = max(per_node)
    figures["answered_rate"] = sum(per_node) / (counts1[0] - counts0[0])
    return figures


def run(
    n: int,
    window: float,
    use_uvloop: bool,
    in_flight: int,
    verifiers: int = 1,
    mode: str = "pull",
    rtts: Sequence[float] = (),
    ima: ImaLoad | None = None,
    mix: float | None = None,
    observe: float = 0.0,
) -> dict[str, float]:
    """One measurement (then one per injected round-trip time in ``rtts``,
    on the same deployment); with ``verifiers`` > 1 they share a scratch
    PostgreSQL database and split the fleet through tooz on Redis. With
    ``ima`` the agents keep growing IMA lists and every node is enrolled
    with the runtime policy allowing them."""
    workdir = tempfile.mkdtemp(prefix="bench-fleet-")
    options: dict[str, object] = {"max_in_flight": in_flight}
    database_url, db_name = None, None
    if verifiers > 1:
        missing = services.missing_services()
        if missing:
            raise SystemExit("--verifiers > 1 needs: " + "; ".join(missing))
        database_url, db_name = services.scratch_postgres()
        options["coordination_url"] = services.redis_coordination_url(2)
        # a group of its own: other deployments may share this Redis
        options["coordination_group"] = f"bench-fleet-{os.getpid()}-{time.time_ns()}"
        options["sync_interval"] = 0.5
    push_port = free_port()
    cluster = fleet_cluster(
        workdir, 0.0, options, verifiers, database_url, push_port=push_port
    )
    push_url = f"https://127.0.0.1:{push_port}" if mode == "push" else None
    try:
        policy = policy_document(ima.paths) if ima is not None else None
        # with realistic intervals every pushing agent has its own
        # connection, as real ones do: part of the memory per push node
        own = mix is not None
        with running_fleet(
            cluster, n, workdir, use_uvloop, 600, push_url, ima, 1, own
        ) as fleet:
            try:
                return asyncio.run(
                    measure(cluster, fleet, window, mode, rtts, policy, mix, observe)
                )
            except Exception:
                _show_logs(os.path.join(workdir, "cluster"))
                raise
    finally:
        if db_name:
            services.drop_postgres(db_name)
        shutil.rmtree(workdir, ignore_errors=True)


def _show_logs(where: str) -> None:
    """The end of each service log, for a run that failed."""
    for root, _, files in os.walk(where):
        for name in sorted(files):
            if name.endswith(".log"):
                with open(os.path.join(root, name), errors="replace") as f:
                    tail = f.read()[-1500:]
                print(f"--- {name} (end)\n{tail}", file=sys.stderr)


def _exit_on_sigterm() -> None:
    # turn SIGTERM (e.g. from timeout) into SystemExit, so that the
    # clean-up in finally blocks and atexit stops every process started
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def main() -> None:
    _exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[1000])
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--in-flight", type=int, default=512)
    parser.add_argument(
        "--verifiers",
        type=int,
        default=1,
        help="verifier processes (>1: PostgreSQL + tooz/Redis)",
    )
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=("pull", "push"),
        default=["pull"],
        help="attestation modes to measure, each on a fresh deployment",
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs per mode (medians printed)"
    )
    parser.add_argument(
        "--rtt",
        type=float,
        nargs="*",
        default=[],
        metavar="MS",
        help="after the 0 ms window, one window per injected round-trip time "
        "(ms; the emulator holds each answer back), same deployment",
    )
    parser.add_argument(
        "--ima",
        type=int,
        default=0,
        metavar="K",
        help="also measure every N with K new IMA entries per quote judged "
        "against a shared runtime policy (pull mode; fresh deployment)",
    )
    parser.add_argument(
        "--ima-paths",
        type=int,
        default=100_000,
        help="paths in the shared runtime policy (with --ima)",
    )
    parser.add_argument(
        "--ima-binary",
        action="store_true",
        help="agents send the binary IMA list, as the real agent does by "
        "default (default here: ascii, the earlier figures' form)",
    )
    parser.add_argument(
        "--mix",
        type=float,
        metavar="SHARE",
        help="realistic intervals: SHARE of the nodes every 2-10 s "
        "(connections kept), the rest every 60-300 s (closed after each "
        "round); prints RSS per node incl. connections",
    )
    parser.add_argument(
        "--observe",
        type=float,
        default=90.0,
        help="with --mix: seconds the mix runs before memory is read",
    )
    parser.add_argument(
        "--no-uvloop",
        action="store_true",
        help="run the emulator on the default asyncio loop",
    )
    args = parser.parse_args()
    if args.ima < 0 or args.ima_paths < 1:
        parser.error("--ima needs K >= 0 and --ima-paths >= 1")
    if args.ima and args.modes != ["pull"]:
        parser.error("--ima measures pull mode only (--modes pull)")
    ima = ImaLoad(args.ima, args.ima_paths, args.ima_binary) if args.ima else None
    rtts = [ms / 1000 for ms in args.rtt if ms > 0]
    intervals = "interval 0" if args.mix is None else mix_text(args.mix)
    print(
        f"verifier vs emulated fleet, {intervals}, {args.window:g} s window, "
        f"{args.verifiers} verifier process(es), {os.cpu_count()} cores shared "
        f"by verifiers and emulator; load average {_load()}"
    )
    print(
        f"{'N':>7} {'mode':>5} {'checks/s':>9} {'verifier CPU':>13} "
        f"{'emulator CPU':>13} {'ver us/chk':>10} {'emu us/chk':>10} "
        f"{'ECDSA vfy':>9} {'ver/floor':>9} {'enrol+bootstrap':>16} {'RSS/node':>9}"
    )
    # --mix: the verifier's growth (bytes) per mode and N
    grown: dict[str, dict[int, float]] = {mode: {} for mode in args.modes}
    for n in args.n:
        rates: dict[str, float] = {}
        for mode in args.modes:
            runs = [
                run(
                    n,
                    args.window,
                    not args.no_uvloop,
                    args.in_flight,
                    args.verifiers,
                    mode,
                    rtts,
                    mix=args.mix,
                    observe=args.observe,
                )
                for _ in range(args.repeat)
            ]
            r = {k: statistics.median(x[k] for x in runs) for k in runs[0]}
            rates[mode] = r["rate"]
            _print_row(n, mode, r)
            _print_rtts(n, mode, r, rtts)
            _print_split(n, r)
            if args.mix is not None:
                _print_memory(n, args.mix, r, mode)
                grown[mode][n] = r["rss_per_node"] * n
        if "pull" in rates and "push" in rates and rates["pull"]:
            print(
                f"{n:>7} push/pull checks/s ratio: {rates['push'] / rates['pull']:.2f}"
            )
        if ima is not None:
            _ima_rows(n, args, ima, plain=r)
    for mode, by_n in grown.items():
        if len(by_n) >= 2:
            _print_projection(mode, by_n)
    print(f"load average at the end {_load()}")


def _ima_rows(
    n: int, args: argparse.Namespace, ima: ImaLoad, plain: dict[str, float]
) -> None:
    """The IMA row of ``n`` (fresh deployments), beside the plain one."""
    runs = [
        run(
            n,
            args.window,
            not args.no_uvloop,
            args.in_flight,
            args.verifiers,
            "pull",
            (),
            ima,
        )
        for _ in range(args.repeat)
    ]
    r = {k: statistics.median(x[k] for x in runs) for k in runs[0]}
    _print_row(n, "+ima", r)
    ratio = r["rate"] / plain["rate"] if plain["rate"] else 0.0
    print(
        f"{n:>7} +ima: {ima.per_quote} new {'binary' if ima.binary else 'ascii'}"
        f" IMA entries per check against one {ima.paths:,}-path runtime policy "
        f"(stored in {r['policy_s']:.1f} s): {r['rate']:.0f} checks/s = "
        f"{ratio:.2f}x plain; verifier {r['verifier_us']:.0f} us/check "
        f"(plain {plain['verifier_us']:.0f}), emulator {r['fleet_us']:.0f} "
        f"us/check (plain {plain['fleet_us']:.0f}); revoked {r['revoked']:.0f}, "
        f"failed {r['failed']:.0f} (plain: revoked {plain['revoked']:.0f}, "
        f"failed {plain['failed']:.0f})"
    )


def _print_projection(mode: str, grown: dict[int, float], at: int = 100_000) -> None:
    """The growth is fixed + N x marginal: from the smallest and largest N
    measured, the figure at ``at`` nodes (same mix)."""
    lo, hi = min(grown), max(grown)
    marginal = (grown[hi] - grown[lo]) / (hi - lo)
    fixed = grown[lo] - marginal * lo
    print(
        f"{mode} projection from N = {lo} and {hi}: {marginal / 1024:.2f} KB "
        f"per node more, {fixed / 2**20:.1f} MiB fixed: at {at:,} nodes "
        f"{(fixed / at + marginal) / 1024:.2f} KB per node incl. connections "
        "(aim <= 8 KB)"
    )


def _print_memory(n: int, share: float, r: dict[str, float], mode: str) -> None:
    per_node = r["rss_per_node"] / 1024
    verdict = "met" if per_node <= 8 else "MISSED"
    mix = mix_text(share) if mode == "pull" else push_mix_text(share)
    print(
        f"{n:>7} {mode} RSS per node incl. connections at {n} nodes: "
        f"{per_node:.2f} KB (aim <= 8 KB at 100,000: {verdict} at this N); "
        f"{mix}; verifier RSS {r['rss']:.0f} MiB, {r['sockets']:.0f} sockets open"
    )


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _print_row(n: int, mode: str, r: dict[str, float]) -> None:
    problems = ""
    if r["revoked"] or r["failed"]:
        problems = f"  (revoked {r['revoked']:.0f}, failed {r['failed']:.0f})"
    ratio = r["verifier_us"] / r["ecdsa_verify_us"]
    print(
        f"{n:>7} {mode:>5} {r['rate']:>9.0f} {r['verifier_cpu']:>12.2f}c "
        f"{r['fleet_cpu']:>12.2f}c {r['verifier_us']:>10.0f} {r['fleet_us']:>10.0f} "
        f"{r['ecdsa_verify_us']:>8.0f}u {ratio:>8.1f}x "
        f"{r['enrol_s']:>15.1f}s {r['rss_per_node'] / 1024:>7.1f}KB{problems}"
    )
    print(
        f"{'':>7} aims: >= 10000 checks/s: {r['rate']:.0f}; verifier CPU per "
        f"check <= 1.5x ECDSA verify ({1.5 * r['ecdsa_verify_us']:.0f} us): "
        f"{r['verifier_us']:.0f} us (of which kernel {r['verifier_sys_us']:.0f}"
        f" us); ECDSA sign {r['ecdsa_sign_us']:.0f} us"
    )


def _print_rtts(n: int, mode: str, r: dict[str, float], rtts: Sequence[float]) -> None:
    for rtt in rtts:
        p = f"rtt{rtt * 1000:g}_"
        share = r[p + "rate"] / r["rate"] * 100 if r["rate"] else 0.0
        print(
            f"{n:>7} {mode:>5} RTT {rtt * 1000:>4.0f} ms: {r[p + 'rate']:>7.0f} "
            f"checks/s = {share:>5.1f} % of 0 ms (aim >= 95 %), verifier "
            f"{r[p + 'verifier_us']:.0f} us/check, emulator "
            f"{r[p + 'fleet_us']:.0f} us/check"
        )


def _print_split(n: int, r: dict[str, float]) -> None:
    if "processes" not in r:
        return
    for i in range(int(r["processes"])):
        p = f"p{i}_"
        print(
            f"{'':>7} verifier {i + 1}: owns {r[p + 'owned']:.0f} nodes, "
            f"{r[p + 'rate']:.0f} checks/s, {r[p + 'cpu']:.2f}c, "
            f"{r[p + 'us']:.0f} us CPU/check"
        )
    whole = sum(r[f"p{i}_rate"] for i in range(int(r["processes"])))
    print(
        f"{'':>7} split: owned {r['owned_sum']:.0f} of {n} nodes, "
        f"{r['nodes_quoted']:.0f} of {n} quoted in the window (quotes per node "
        f"min {r['node_min']:.0f} median {r['node_median']:.0f} max "
        f"{r['node_max']:.0f}); processes' checks/s add up to {whole:.0f}, the "
        f"emulator answered {r['answered_rate']:.0f}/s"
    )


if __name__ == "__main__":
    main()
