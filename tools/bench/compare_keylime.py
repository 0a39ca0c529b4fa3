#!/usr/bin/env python3
"""Our verifier against keylime 7.14.3's, same emulated fleet size, same machine.

For each N: first keylime (tools/bench/keylime/bench.py: keylime installed
from PyPI into its own venv under ~/.cache, its registrar and verifier with
SQLite and mTLS, quote_interval 0, against N emulated agents speaking
keylime's agent API v2.2 on software TPMs), then ours (tools/bench/fleet.py,
interval 0, same N). Prints both rates, each side's verifier and emulator
CPU, each verifier's CPU per passed quote, the ratio ours/keylime of the
rates (aim: at least 100x at every N) and of the CPU per quote (which the
load of a shared machine changes least). Nothing is asserted; both sides
share this machine's cores with their emulators (and with whatever else is
running); the load average is printed at the start and the end.

    .venv/bin/python tools/bench/compare_keylime.py [--n 100 ...] [--window 20] [--plot]

``--plot`` writes doc/source/perf/rate_vs_n.png (rate against N, both
systems; needs matplotlib in this venv).

``--ima K`` (issue 19, "IMA under load") runs both sides with IMA instead:
every emulated agent's ima-ng list grows by K entries per quote (the same
lists on both sides: trusted_testing/fleet_ima.py), every node is enrolled
with one shared runtime policy of ``--ima-paths`` paths (ours: a stored
policy referenced by digest; keylime: a named allowlist referenced by name,
PCR 10 in the mask), and each check replays and judges the K new entries
from where the last one ended (ours: ``ima_from``; keylime:
``ima_ml_entry``)::

    .venv/bin/python tools/bench/compare_keylime.py --n 50 200 --ima 100
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def _load(name: str, path: str):  # type: ignore[no-untyped-def]
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Loaded by path: both directories hold a fleet.py.
ours_bench = _load("ours_fleet_bench", os.path.join(HERE, "fleet.py"))
keylime_bench = _load("keylime_bench", os.path.join(HERE, "keylime", "bench.py"))
sys.path.insert(0, ROOT)
from trusted_testing.fleet_ima import ImaLoad  # noqa: E402


def plot(rows: list[dict], path: str) -> None:  # type: ignore[type-arg]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = [r["n"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(ns, [r["ours"]["rate"] for r in rows], "o-", label="ours")
    ax.plot(
        ns, [r["keylime"]["rate_passed"] for r in rows], "s-", label="keylime 7.14.3"
    )
    ax.set_xlabel("emulated nodes (N)")
    ax.set_ylabel("full checks per second")
    ax.set_yscale("log")
    ax.set_title(f"quote interval 0, {os.cpu_count()} cores shared with the emulator")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[100])
    parser.add_argument("--window", type=float, default=20.0)
    parser.add_argument(
        "--in-flight", type=int, default=512, help="ours: max_in_flight"
    )
    parser.add_argument(
        "--uvloop", action="store_true", help="ours: emulator on uvloop"
    )
    parser.add_argument(
        "--ima",
        type=int,
        default=0,
        metavar="K",
        help="both sides: K new IMA entries per quote against a shared "
        "runtime policy (instead of the plain PCR-only case)",
    )
    parser.add_argument("--ima-paths", type=int, default=100_000)
    parser.add_argument("--plot", action="store_true")
    parser.add_argument("--json", help="also write the raw results here")
    args = parser.parse_args()
    if args.ima < 0 or args.ima_paths < 1:
        parser.error("--ima needs K >= 0 and --ima-paths >= 1")
    ima = ImaLoad(args.ima, args.ima_paths) if args.ima else None
    case = (
        f"IMA: {ima.per_quote} new ascii entries per quote, one shared "
        f"{ima.paths:,}-path runtime policy"
        if ima is not None
        else "PCR policy only"
    )
    print(
        f"{datetime.date.today()}: keylime {keylime_bench.env.KEYLIME_VERSION} "
        f"vs ours, {case}, "
        f"interval 0, {args.window:g} s window, {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    print(
        f"{'N':>5} | {'keylime q/s':>11} {'passed/s':>9} "
        f"{'ver CPU':>8} {'emu CPU':>8} {'us/quote':>9} | "
        f"{'ours chk/s':>10} {'ver CPU':>8} {'emu CPU':>8} {'us/check':>9} | "
        f"{'ours/keylime':>12} {'CPU ratio':>9}"
    )
    rows = []
    for n in args.n:
        try:
            k = keylime_bench.run(n, args.window, ima=ima)
            o = ours_bench.run(n, args.window, args.uvloop, args.in_flight, ima=ima)
        except (RuntimeError, OSError) as exc:  # one N failing loses no other
            print(f"{n:>5} | failed: {exc}", flush=True)
            continue
        ratio = o["rate"] / k["rate_passed"] if k["rate_passed"] else float("inf")
        # verifier CPU per passed quote: what the load on a shared machine
        # changes least (the rates move with the CPU each side was given)
        k_us = k["verifier_cpu"] / k["rate_passed"] * 1e6 if k["rate_passed"] else 0
        o_us = o["verifier_cpu"] / o["rate"] * 1e6 if o["rate"] else 0
        cpu_ratio = k_us / o_us if o_us else float("inf")
        rows.append(
            {
                "n": n,
                "keylime": k,
                "ours": o,
                "ratio": ratio,
                "cpu_ratio": cpu_ratio,
                "ima": args.ima,
                "ima_paths": args.ima_paths if ima is not None else 0,
                "load": os.getloadavg()[0],
            }
        )
        notes = []
        if k["failed"] or k["get_quote"] != n:
            notes.append(f"keylime states {k['states']}")
        if o.get("failed") or o.get("revoked"):
            notes.append(f"ours failed {o.get('failed')} revoked {o.get('revoked')}")
        print(
            f"{n:>5} | {k['rate']:>11.1f} {k['rate_passed']:>9.1f} "
            f"{k['verifier_cpu']:>7.2f}c {k['fleet_cpu']:>7.2f}c {k_us:>9.0f} | "
            f"{o['rate']:>10.0f} {o['verifier_cpu']:>7.2f}c {o['fleet_cpu']:>7.2f}c "
            f"{o_us:>9.0f} | {ratio:>11.0f}x {cpu_ratio:>8.0f}x"
            + ("  " + "; ".join(notes) if notes else ""),
            flush=True,
        )
        if args.json:  # written after each N: a later failure keeps these
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(rows, f, indent=1, default=str)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    if args.plot and rows:
        plot(rows, os.path.join(ROOT, "doc", "source", "perf", "rate_vs_n.png"))


if __name__ == "__main__":
    main()
