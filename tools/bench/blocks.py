#!/usr/bin/env python3
"""Per-4 KB block costs of sealed objects (Plutus-style), and root signing.

Prints, per 4 KB block: SHA-256 leaf hash, AES-256-GCM encrypt, and the
check of one block alone (leaf hash + authentication path to the root of a
1 MiB object + AES-GCM decrypt); per object: Ed25519 root sign and verify,
whole-object seal of 1 MiB, and key-regression derivation of an old
version's key. Medians over --rounds, in milliseconds.

Plutus (Kallahalla et al., FAST 2003, 2003 hardware, RSA roots) reports
hash 0.11 ms and encrypt 0.59 ms per 4 KB, root sign 28.5 ms, verify 8.5 ms;
printed beside ours.

    .venv/bin/python tools/bench/blocks.py [--rounds 7] [--n 2000]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))

from cryptography.hazmat.primitives.asymmetric import ed25519  # noqa: E402
from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # noqa: E402

from verifier.protocol.merkle import BLOCK, BlockVerifier, seal_object  # noqa: E402
from verifier.protocol.regression import KeyRegressionOwner  # noqa: E402


def timed(fn: Callable[[], object], n: int, rounds: int) -> float:
    results = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        results.append((time.perf_counter() - t0) / n * 1e3)
    return statistics.median(results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--n", type=int, default=2000)
    args = parser.parse_args()
    n, rounds = args.n, args.rounds
    block = os.urandom(BLOCK)
    key = os.urandom(32)
    aead = AESGCM(key)
    nonce = os.urandom(12)
    writer = ed25519.Ed25519PrivateKey.generate()
    verifier = BlockVerifier(writer.public_key())
    data = os.urandom(256 * BLOCK)
    sealed = seal_object("bench", data, 0, key, writer)
    header = sealed.header
    path = sealed.path(100)
    owner = KeyRegressionOwner("bench", length=4096)
    for _ in range(100):
        owner.wind()
    reader = owner.reader_state()
    rows = [
        (
            "hash per 4 KB (SHA-256 leaf)",
            timed(lambda: hashlib.sha256(block).digest(), n, rounds),
            "0.11",
        ),
        (
            "encrypt per 4 KB (AES-256-GCM)",
            timed(lambda: aead.encrypt(nonce, block, b"ad"), n, rounds),
            "0.59",
        ),
        (
            "verify one 4 KB block alone (path, 1 MiB object)",
            timed(
                lambda: verifier.check_block(header, 100, sealed.blocks[100], path),
                n,
                rounds,
            ),
            "-",
        ),
        (
            "root check + path + decrypt one 4 KB block",
            timed(
                lambda: verifier.read_block(header, 100, sealed.blocks[100], path, key),
                n // 4,
                rounds,
            ),
            "-",
        ),
        (
            "root sign (Ed25519)",
            timed(lambda: writer.sign(header.signed_bytes()), n // 4, rounds),
            "28.5",
        ),
        (
            "root verify (Ed25519)",
            timed(lambda: verifier.check_header(header), n // 4, rounds),
            "8.5",
        ),
        (
            "seal 1 MiB (256 blocks + tree + sign)",
            timed(lambda: seal_object("b", data, 0, key, writer), 5, rounds),
            "-",
        ),
        (
            "derive key 100 versions back",
            timed(lambda: reader.key(0), n // 4, rounds),
            "-",
        ),
    ]
    print(f"Sealed-object block costs, median of {rounds} rounds (one core), ms")
    print(f"{'operation':<50} {'ours ms':>9} {'Plutus ms':>10}")
    print("-" * 71)
    for name, ours, plutus in rows:
        print(f"{name:<50} {ours:>9.4f} {plutus:>10}")


if __name__ == "__main__":
    main()
