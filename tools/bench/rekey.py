#!/usr/bin/env python3
"""LKH group rekeying cost per revocation (Ensemble-style), vs naive O(n).

For n = 10 ... 100,000 members (d-ary tree, default d = 4) it revokes one
member and prints: encrypted keys (wrapped keys in the rekey message), the
message's bytes, the controller's milliseconds (fresh keys, AES key wraps,
Ed25519 signature) and one remaining member's milliseconds to apply it
(signature check + unwraps). Naive rekeying sends the new group key wrapped
under each remaining member's own key: n - 1 keys. A batch of 10 revocations
in one message shows the shared path updates. Medians over --rounds.

Ensemble (Rodeh, Birman, Dolev 2002) reports ~4 ms per rekey on 20-member
groups (Diamond algorithm, 2002 hardware); printed beside ours.

    .venv/bin/python tools/bench/rekey.py [--degree 4] [--rounds 5] [--max 100000]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))

from cryptography.hazmat.primitives.asymmetric import ed25519  # noqa: E402
from cryptography.hazmat.primitives.keywrap import aes_key_wrap  # noqa: E402

from verifier.protocol.lkh import LkhMember, LkhTree  # noqa: E402

SIGNER = ed25519.Ed25519PrivateKey.generate()


def lkh_round(n: int, d: int, rounds: int, batch: int) -> dict[str, float]:
    tree = LkhTree("bench", SIGNER, d)
    tree.bulk_add(f"m{i}" for i in range(n))
    rnd = random.Random(n)
    stays = "m0"
    member = LkhMember(tree.welcome(stays), SIGNER.public_key(), d)
    ms, apply_ms, entries, size = [], [], [], []
    for _ in range(rounds):
        gone = rnd.sample([f"m{i}" for i in range(1, n)], batch) if n > batch else []
        gone = [g for g in gone if g in tree]
        t0 = time.perf_counter()
        msg = tree.revoke(gone)
        ms.append((time.perf_counter() - t0) * 1e3)
        t0 = time.perf_counter()
        member.apply(msg)
        apply_ms.append((time.perf_counter() - t0) * 1e3)
        entries.append(len(msg.entries))
        size.append(len(msg.to_bytes()))
        tree.bulk_add(gone)  # seat them again for the next round
        member.resync(tree.welcome(stays))
    return {
        "entries": statistics.median(entries),
        "bytes": statistics.median(size),
        "ms": statistics.median(ms),
        "apply_ms": statistics.median(apply_ms),
    }


def naive_round(n: int, rounds: int) -> dict[str, float]:
    member_keys = [os.urandom(32) for _ in range(n - 1)]
    ms = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        group = os.urandom(32)
        wrapped = [aes_key_wrap(k, group) for k in member_keys]
        SIGNER.sign(b"".join(wrapped))
        ms.append((time.perf_counter() - t0) * 1e3)
    return {
        "entries": n - 1,
        "bytes": (n - 1) * (40 + 4) + 64,
        "ms": statistics.median(ms),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--degree", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max", type=int, default=100_000)
    args = parser.parse_args()
    sizes = [n for n in (10, 20, 100, 1000, 10_000, 100_000) if n <= args.max]
    print(
        f"LKH rekey per revocation, d = {args.degree}, "
        f"median of {args.rounds} (one core)"
    )
    head = (
        f"{'n':>7} | {'LKH keys':>8} {'bytes':>7} {'ms':>7} {'apply ms':>8} | "
        f"{'batch10 keys':>12} {'ms':>6} | {'naive keys':>10} {'bytes':>9} {'ms':>8}"
    )
    print(head)
    print("-" * len(head))
    for n in sizes:
        one = lkh_round(n, args.degree, args.rounds, 1)
        ten = lkh_round(n, args.degree, args.rounds, 10) if n > 10 else None
        naive = naive_round(n, args.rounds)
        batch = (
            f"{ten['entries']:>12.0f} {ten['ms']:>6.2f}"
            if ten
            else f"{'-':>12} {'-':>6}"
        )
        print(
            f"{n:>7} | {one['entries']:>8.0f} {one['bytes']:>7.0f} {one['ms']:>7.3f} "
            f"{one['apply_ms']:>8.3f} | {batch} | {naive['entries']:>10} "
            f"{naive['bytes']:>9} {naive['ms']:>8.2f}"
        )
    print("Ensemble (Diamond, 2002): ~4 ms per rekey on 20-member groups")


if __name__ == "__main__":
    main()
