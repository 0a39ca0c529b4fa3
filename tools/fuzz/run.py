#!/usr/bin/env python3
"""Coverage-guided fuzzing (atheris) of every parser and judging entry point
of the protocol core (``trusted_testing.fuzz_targets``).

    tools/fuzz/run.py --list
    tools/fuzz/run.py TARGET [--runs N] [--corpus DIR]   # one target
    tools/fuzz/run.py --all [--runs N]                   # each, own process
    tools/fuzz/run.py all [--runs N]                     # all in one process

A finding is any exception outside the project's errors
(:class:`verifier.protocol.errors.ProtocolError`): libFuzzer stops, writes
the input to ``tools/fuzz/crashes/<target>-crash-<sha1>``; keep it as a
regression under ``tools/fuzz/regressions/<target>/`` (the unit tests replay
every file there). ``--all`` prints the executions per target from
libFuzzer's ``Done N runs`` line. Exit status: 0 clean, 1 a finding, 2 usage.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CRASHES = os.path.join(HERE, "crashes")
_DONE = re.compile(rb"Done (\d+) runs in (\d+) second")


def _fuzz(name: str, runs: int, corpus: str | None, max_len: int) -> None:
    """Run one target (or ``all``) under atheris in this process."""
    import atheris

    with atheris.instrument_imports(include=["verifier", "trusted_testing"]):
        from trusted_testing import fuzz_targets

        # The targets import what they judge lazily: run each seed once here
        # so those modules are imported (and instrumented) too, not only the
        # ones fuzz_targets imports itself.
        chosen = (
            fuzz_targets.TARGETS.values()
            if name == "all"
            else [fuzz_targets.TARGETS[name]]
        )
        for target in chosen:
            for seed in target.seeds():
                fuzz_targets.run_one(target, seed)

    targets = list(fuzz_targets.TARGETS.values())
    if name == "all":

        def one(data: bytes) -> None:
            if data:
                target = targets[data[0] % len(targets)]
                fuzz_targets.run_one(target, data[1:])

        seeds = [bytes([i]) + seed for i, t in enumerate(targets) for seed in t.seeds()]
    else:
        target = fuzz_targets.TARGETS[name]

        def one(data: bytes) -> None:
            fuzz_targets.run_one(target, data)

        seeds = list(target.seeds())
        max_len = max(max_len, target.max_len)
    corpus = corpus or tempfile.mkdtemp(prefix=f"fuzz-{name}-")
    os.makedirs(corpus, exist_ok=True)
    for i, seed in enumerate(seeds):
        with open(os.path.join(corpus, f"seed-{i}"), "wb") as f:
            f.write(seed)
    os.makedirs(CRASHES, exist_ok=True)
    args = [
        sys.argv[0],
        f"-runs={runs}",
        f"-max_len={max_len}",
        f"-artifact_prefix={os.path.join(CRASHES, name)}-",
        "-print_final_stats=1",
        "-rss_limit_mb=4096",
        corpus,
    ]
    atheris.Setup(args, one)
    atheris.Fuzz()


def _each(runs: int, max_len: int, names: list[str]) -> int:
    """Run every target in its own process; print executions per target."""
    print(f"{'target':<16} {'executions':>12} {'seconds':>8}  result")
    status = 0
    for name in names:
        started = time.monotonic()
        proc = subprocess.run(
            [sys.executable, __file__, name, f"--runs={runs}", f"--max-len={max_len}"],
            capture_output=True,
            cwd=ROOT,
        )
        seconds = time.monotonic() - started
        done = _DONE.search(proc.stderr)
        count = int(done.group(1)) if done else 0
        result = (
            "clean" if proc.returncode == 0 else f"FINDING (exit {proc.returncode})"
        )
        if proc.returncode != 0:
            status = 1
            tail = proc.stderr.decode("utf-8", "replace").strip().splitlines()[-25:]
            print("\n".join("    " + line for line in tail), file=sys.stderr)
        print(f"{name:<16} {count:>12} {seconds:>8.1f}  {result}", flush=True)
    return status


def _names() -> list[str]:
    """The target names, from a child process: this one must import the
    code under test only once atheris instruments it."""
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from trusted_testing.fuzz_targets import TARGETS; print(*sorted(TARGETS))",
        ],
        capture_output=True,
        check=True,
        cwd=ROOT,
    )
    return out.stdout.decode().split()


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, ROOT)
    names = _names()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", nargs="?", help="a target, or 'all'")
    parser.add_argument("--all", action="store_true", help="each target in turn")
    parser.add_argument("--list", action="store_true", help="list the targets")
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--max-len", type=int, default=4096)
    parser.add_argument("--corpus", help="corpus directory (default: a temp dir)")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(names))
        return 0
    if args.all:
        return _each(args.runs, args.max_len, names)
    if args.target not in [*names, "all"]:
        parser.error(f"target must be one of: all, {', '.join(names)}")
    _fuzz(args.target, args.runs, args.corpus, args.max_len)
    return 0


if __name__ == "__main__":
    sys.exit(main())
