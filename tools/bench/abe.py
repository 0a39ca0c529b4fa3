#!/usr/bin/env python3
"""Policy-sealing (CP-ABE) cost beside Excalibur's published figures.

BSW07 over BLS12-381 (pymcl). For n = 1, 5, 10, 20, 50 attributes: keygen
with n attributes; seal and unseal of 1 KB and 1 MB payloads under the AND
of n attributes (seal includes encoding the blob; unseal includes decoding
and validating it). Prints medians in milliseconds. Not a test: nothing is
asserted.

    .venv/bin/python tools/bench/abe.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))

from verifier.protocol import abe  # noqa: E402

# Excalibur (Santos et al., USENIX Security 2012), 10 attributes.
EXCALIBUR = {
    "keygen": 120.0,
    "seal 1KB": 128.0,
    "unseal 1KB": 51.0,
    "seal 1MB": 134.0,
    "unseal 1MB": 68.0,
}
AIMS = {"keygen": 5.0, "seal 1KB": 6.0, "unseal 1KB": 12.0}


def median_ms(fn: Callable[[], object], rounds: int) -> float:
    fn()  # warm up
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--sizes", default="1,5,10,20,50")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]

    pp, msk = abe.setup()
    kb, mb = os.urandom(1024), os.urandom(1 << 20)
    cols = list(EXCALIBUR)
    rows: dict[int, dict[str, float]] = {}
    for n in sizes:
        attrs = [f"attr{i}=v{i}" for i in range(n)]
        policy = " and ".join(attrs)
        sk = abe.keygen(msk, attrs)
        blob_kb = abe.seal(pp, policy, kb)
        blob_mb = abe.seal(pp, policy, mb)
        rows[n] = {
            "keygen": median_ms(lambda a=attrs: abe.keygen(msk, a), args.rounds),
            "seal 1KB": median_ms(lambda p=policy: abe.seal(pp, p, kb), args.rounds),
            "unseal 1KB": median_ms(
                lambda s=sk, b=blob_kb: abe.unseal(pp, s, b), args.rounds
            ),
            "seal 1MB": median_ms(lambda p=policy: abe.seal(pp, p, mb), args.rounds),
            "unseal 1MB": median_ms(
                lambda s=sk, b=blob_mb: abe.unseal(pp, s, b), args.rounds
            ),
        }
        rows[n]["_ct"] = len(blob_kb) - len(kb) - 16

    print(
        f"CP-ABE BSW07 / BLS12-381 (pymcl), median of {args.rounds} runs, ms; "
        f"{platform.machine()}, {os.cpu_count()} cores, shared and noisy machine"
    )
    head = f"{'attributes':>10} " + " ".join(f"{c:>11}" for c in cols)
    print(head + f" {'overhead B':>10}")
    for n in sizes:
        line = f"{n:>10} " + " ".join(f"{rows[n][c]:>11.2f}" for c in cols)
        print(line + f" {int(rows[n]['_ct']):>10}")
    print(f"{'Excalibur':>10} " + " ".join(f"{EXCALIBUR[c]:>11.0f}" for c in cols))
    print("  (Excalibur: 10 attributes, its 2012 hardware and pairing library)")
    print(
        f"{'aim @10':>10} "
        + " ".join(f"{AIMS[c]:>11.0f}" if c in AIMS else f"{'-':>11}" for c in cols)
    )


if __name__ == "__main__":
    main()
