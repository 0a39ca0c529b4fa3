"""Seconds of the long tests, so that stestr can balance its workers.

stestr splits the tests between its workers by the durations recorded in
its repository, and hands out tests it has no duration for in turn. The
test command starts from an empty repository (``tools/run-tests.sh``
removes ``.stestr``), so without help the long classes (the real guests,
Nova, Keystone) land wherever the turn puts them: two of them on one
worker made one run 37 minutes against 21 for the other worker.

``tools/test-times.txt`` keeps the seconds of each test of the classes that
took a while in a real run. Two commands:

``seed``
    loads those durations into the empty repository as a subunit stream
    (``stestr load``) before ``stestr run`` partitions. A test not listed
    stays unknown (a new test of a listed class makes its class "partly
    timed", scheduled after the timed ones); a listed test that no longer
    exists is never asked for.
``update``
    writes ``tools/test-times.txt`` anew from the last run
    (``stestr last --subunit``): every test of each class that took at
    least ``--min`` seconds.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import io
import os
import subprocess
import sys
from typing import Any

import subunit
import testtools

TIMES = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    "tools",
    "test-times.txt",
)
_EPOCH = datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC)


def class_of(test_id: str) -> str:
    """The class part of a test id (stestr's own grouping: up to the last dot)."""
    return test_id.split("[", 1)[0].rsplit(".", 1)[0]


class TimesFileError(Exception):
    """A line of the times file that is not ``test_id seconds``."""


def read_times(path: str = TIMES) -> dict[str, float]:
    """``test_id seconds`` per line; ``#`` starts a comment."""
    times: dict[str, float] = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            try:
                name, seconds = line.split()
                times[name] = float(seconds)
            except ValueError:
                raise TimesFileError(f"{path}:{number}: expected 'test_id seconds'")
    return times


def seed_stream(times: dict[str, float]) -> bytes:
    """A subunit v2 stream in which each test succeeded in its seconds."""
    out = io.BytesIO()
    stream = subunit.StreamResultToBytes(out)
    clock = _EPOCH
    for test_id, seconds in times.items():
        stream.status(test_id=test_id, test_status="inprogress", timestamp=clock)
        clock += datetime.timedelta(seconds=seconds)
        stream.status(test_id=test_id, test_status="success", timestamp=clock)
    return out.getvalue()


def measured(subunit_bytes: bytes) -> dict[str, float]:
    """Seconds per test in a subunit v2 stream of a real run.

    A test's seconds run from the end of the test before it on the same
    worker to its own end, so that a class's ``setUpClass`` (a guest's boot,
    a Nova deployment) counts in its first test: stestr's own durations
    leave it out, and it is most of a long class's time.
    """
    runs: dict[str, list[tuple[datetime.datetime, datetime.datetime, str]]] = (
        collections.defaultdict(list)
    )

    def on_test(test: Any) -> None:
        start, stop = test["timestamps"]
        if start is not None and stop is not None:
            workers = sorted(t for t in test["tags"] if t.startswith("worker-"))
            runs[workers[0] if workers else ""].append((start, stop, test["id"]))

    case = subunit.ByteStreamToStreamResult(io.BytesIO(subunit_bytes))
    result = testtools.StreamToDict(on_test)
    result.startTestRun()
    case.run(result)
    result.stopTestRun()
    times: dict[str, float] = {}
    for tests in runs.values():
        tests.sort()
        previous = None
        for start, stop, test_id in tests:
            since = start if previous is None else min(start, previous)
            times[test_id] = (stop - since).total_seconds()
            previous = stop
    return times


def _seed() -> int:
    subprocess.run(
        ["stestr", "load"],
        input=seed_stream(read_times()),
        stdout=subprocess.DEVNULL,
        check=True,
    )
    return 0


def _update(minimum: float) -> int:
    last = subprocess.run(
        ["stestr", "last", "--subunit"], capture_output=True, check=True
    ).stdout
    times = measured(last)
    totals: dict[str, float] = collections.defaultdict(float)
    for test_id, seconds in times.items():
        totals[class_of(test_id)] += seconds
    kept = sorted(
        (t for t in times if totals[class_of(t)] >= minimum),
        key=lambda t: (-totals[class_of(t)], t),
    )
    lines = [
        "# Seconds per test of the long classes in a real run",
        "# (python -m trusted_testing.test_times update); tools/run-tests.sh",
        "# seeds stestr with them so that its workers get even shares.",
    ]
    lines += [f"{t} {times[t]:.1f}" for t in kept]
    with open(TIMES, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{len(kept)} tests written to {TIMES}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("seed", help="load the class times into the empty repository")
    update = sub.add_parser("update", help="rewrite test-times.txt from the last run")
    update.add_argument("--min", type=float, default=20.0, help="seconds (20)")
    args = parser.parse_args(argv)
    try:
        if args.command == "seed":
            return _seed()
        return _update(args.min)
    except (TimesFileError, OSError, subprocess.CalledProcessError) as exc:
        print(f"test_times: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
