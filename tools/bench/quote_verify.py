#!/usr/bin/env python3
"""Protocol-core quote verification cost (issue: <= 100 us per check).

Builds honest quotes with the software TPM (ECC P-256 and RSA-2048 AKs) and
times ``verify_quote`` (parse the wire dict, check signature, nonce, PCR
digest and policy, clock) in a tight loop. Prints the median over several
rounds, in microseconds per check. Not a test: nothing is asserted.

    .venv/bin/python tools/bench/quote_verify.py [--rounds 7] [--n 2000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))

from trusted_testing.softtpm import SoftTpm  # noqa: E402
from verifier import protocol as p  # noqa: E402


def bench(ak_alg: str, n: int, rounds: int, from_wire: bool) -> float:
    tpm = SoftTpm(ak_alg=ak_alg)
    tpm.extend(16, os.urandom(32))
    policy = p.PcrPolicy.from_dict({"pcrs": {"16": tpm.pcrs[16].hex()}})
    ak = p.AttestationKey(p.TpmPublic.from_bytes(tpm.ak.to_bytes()), True)
    nonce = os.urandom(20)
    nk = os.urandom(32)
    qd = p.bind_nonce(nonce, nk)
    quote = tpm.quote(qd, (16,))
    wire = quote.to_dict()
    results = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            q = p.Quote.from_dict(wire) if from_wire else quote
            p.verify_quote(
                q,
                ak=ak,
                qualifying_data=p.bind_nonce(nonce, nk),
                policy=policy,
                previous_clock=None,
            )
        results.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--n", type=int, default=2000)
    args = parser.parse_args()
    print(
        "protocol-core quote verification, median of "
        f"{args.rounds} rounds x {args.n} checks (one core)"
    )
    for alg in ("ecc", "rsa"):
        wire = bench(alg, args.n, args.rounds, True)
        core = bench(alg, args.n, args.rounds, False)
        print(
            f"  {alg.upper()} AK: {core:7.1f} us/check verify_quote, "
            f"{wire:7.1f} us/check incl. JSON-dict decoding "
            f"({1e6 / wire:,.0f} checks/s)"
        )


if __name__ == "__main__":
    main()
