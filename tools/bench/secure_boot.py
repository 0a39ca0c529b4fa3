#!/usr/bin/env python3
"""Measured boot under UEFI Secure Boot, timed (a benchmark, not a test).

1. **Judging a boot**: the verifier's work for one boot's firmware event
   log -- parse it, replay it into the sha256 PCRs it quoted, evaluate the
   measured-boot policy with its whole Secure Boot chain (PK, KEK, db, dbx,
   authorities, SBAT, MOK, shim, GRUB, kernels, command lines, initrds) --
   on the real log of ``trusted_testing/fixtures/secure-boot`` (OVMF +
   Debian's shim, GRUB and kernel). Prints the median µs per boot and
   events per second over ``--repeat`` rounds of ``--boots`` boots each,
   beside the same log judged by a policy of ``secure_boot`` only (the
   chain's own cost is the difference).
Generating the policy from a disk image: ``tools/bench/mb_image_policy.py``.
Boot to attested of the Secure Boot guest against the direct-boot guest:
``tools/bench/guest_vm.py --secure-boot``.

    .venv/bin/python tools/bench/secure_boot.py [--boots 2000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))

from trusted_testing import FIXTURES  # noqa: E402
from verifier.protocol.mb import MeasuredBootPolicy, evaluate, parse  # noqa: E402
from verifier.protocol.mb.replay import replay  # noqa: E402

HERE = os.path.join(FIXTURES, "secure-boot")


def judge(raw: bytes, policy: MeasuredBootPolicy) -> int:
    """What the verifier does with one boot's log; the number of events."""
    events = parse(raw).events
    replay(events, banks=("sha256",), pcrs=range(24))
    failures = evaluate(policy, events)
    if failures:
        raise SystemExit(f"the fixture's policy refused its own log: {failures[0]}")
    return len(events)


def rounds(work: Callable[[], object], count: int, repeat: int) -> list[float]:
    """Seconds per call, one figure per round of ``count`` calls."""
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(count):
            work()
        out.append((time.perf_counter() - start) / count)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--boots", type=int, default=2000, help="logs per round")
    parser.add_argument("--repeat", type=int, default=5, help="rounds")
    args = parser.parse_args()
    with open(os.path.join(HERE, "binary_bios_measurements"), "rb") as handle:
        raw = handle.read()
    with open(os.path.join(HERE, "policy.json"), encoding="utf-8") as handle:
        chain = MeasuredBootPolicy.from_dict(json.load(handle))
    plain = MeasuredBootPolicy.from_dict({"secure_boot": True})
    events = judge(raw, chain)
    print(f"real log: {events} events, {len(raw)} bytes ({HERE})")
    for name, policy in (("secure_boot only", plain), ("whole chain", chain)):
        per = rounds(lambda p=policy: judge(raw, p), args.boots, args.repeat)
        median = statistics.median(per)
        print(
            f"  {name:18s} {median * 1e6:8.1f} us per boot, "
            f"{events / median:10.0f} events/s "
            f"(min {min(per) * 1e6:.1f}, max {max(per) * 1e6:.1f} us; "
            f"{args.repeat} rounds of {args.boots})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
