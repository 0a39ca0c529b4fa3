#!/usr/bin/env python3
"""The attestation log's pure core at 10^6 entries (issue 30 item 2).

Builds a tree of N log entries (default 10^6) in memory, keeping every node
Frontier.append hands back (one list per level stands in for the store's
table), then prints:

* the append rate: LogEntry encoding + leaf hash, Frontier.append alone,
  and both (what the sequencer pays per verdict change);
* proof sizes at N: inclusion (by leaf position) and consistency (by the
  kept tree's size), in hashes and bytes, and one entry with its proof as
  JSON (what a tenant downloads per entry);
* median microseconds to build (from the in-memory NodeGetter) and to
  verify an inclusion and a consistency proof, and to check one node's
  history of 20 entries;
* median microseconds to sign a checkpoint and to open (verify) it.

Not a test: nothing is asserted.

    .venv/bin/python tools/bench/translog.py [--entries 1000000] [--rounds 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))

from cryptography.hazmat.primitives.asymmetric import ed25519  # noqa: E402

from verifier.protocol.translog import (  # noqa: E402
    Checkpoint,
    EntryKind,
    Frontier,
    HistoryProof,
    LogEntry,
    consistency_proof,
    inclusion_proof,
    leaf_hash,
    log_origin,
    open_checkpoint,
    sign_checkpoint,
    verify_consistency,
    verify_history,
    verify_inclusion,
)

KINDS = list(EntryKind)


def median_us(fn: Callable[[], object], rounds: int) -> float:
    fn()
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(samples)


def entry(index: int, prev: int | None, node: str) -> LogEntry:
    return LogEntry(
        index=index,
        prev=prev,
        node_uuid=node,
        project_id="0123456789abcdef0123456789abcdef",
        kind=KINDS[index % len(KINDS)],
        reason="pcr_policy",
        detail="PCR 10 does not match the policy",
        created_at=1_764_000_000.0 + index / 100,
        event_id=str(uuid.UUID(int=(1 << 100) + index)),
    )


def build_leaves(n: int, node: str, every: int) -> tuple[list[bytes], list[LogEntry]]:
    """Leaf hashes of ``n`` entries; one node's every ``every``-th leaf is a
    real chained entry (kept), the others stand-ins of the same size."""
    filler = entry(0, None, str(uuid.UUID(int=2))).to_bytes()
    leaves: list[bytes] = []
    mine: list[LogEntry] = []
    for i in range(n):
        if i % every == 0:
            mine.append(entry(i, mine[-1].index if mine else None, node))
            leaves.append(mine[-1].leaf())
        else:
            leaves.append(leaf_hash(i.to_bytes(8, "big") + filler))
    return leaves, mine


def row(label: str, value: float, unit: str, fmt: str = ",.1f") -> None:
    print(f"  {label:<34} {value:>12{fmt}} {unit}")


class Tree:
    """Every node Frontier.append hands back, one list per level (nodes of
    a level complete in index order): the store's table, in memory."""

    def __init__(self, leaves: list[bytes]) -> None:
        self.levels: list[list[bytes]] = [[] for _ in range(64)]
        self.frontier = Frontier()
        t0 = time.perf_counter()
        for leaf in leaves:
            for level, _, digest in self.frontier.append(leaf):
                self.levels[level].append(digest)
        self.seconds = time.perf_counter() - t0
        self.size, self.root = self.frontier.size, self.frontier.root()

    def get(self, level: int, index: int) -> bytes:
        return self.levels[level][index]


def bench_append(n: int, every: int) -> tuple[Tree, list[bytes], list[LogEntry]]:
    sample = min(n, 100_000)
    t0 = time.perf_counter()
    entries = [entry(i, None, str(uuid.UUID(int=i))) for i in range(sample)]
    t_make = (time.perf_counter() - t0) / sample
    t0 = time.perf_counter()
    for e in entries:
        e.leaf()
    t_leaf = (time.perf_counter() - t0) / sample
    leaves, mine = build_leaves(n, str(uuid.UUID(int=1)), every)
    tree = Tree(leaves)
    print("\nappend")
    row("LogEntry(...), validating", 1 / t_make, "entries/s", ",.0f")
    row("to_bytes + leaf_hash", 1 / t_leaf, "leaves/s", ",.0f")
    row(f"Frontier.append to {n:,}", n / tree.seconds, "leaves/s", ",.0f")
    row("entry + hash + append", (t_make + t_leaf + tree.seconds / n) * 1e6, "µs")
    stored = sum(len(level) for level in tree.levels)
    row("nodes stored per leaf", stored / n, "", ".2f")
    return tree, leaves, mine


def bench_sizes(tree: Tree, mine: list[LogEntry]) -> None:
    n = tree.size
    print(f"\nproof sizes at N = {n:,}")
    for index in (0, n // 2, n - 2, n - 1):
        size = len(inclusion_proof(index, n, tree.get))
        row(f"inclusion of leaf {index:,}", 32 * size, f"B ({size} hashes)", "")
    for old in (1, n // 3, n // 2, n - 1):
        size = len(consistency_proof(old, n, tree.get))
        row(f"consistency {old:,} -> N", 32 * size, f"B ({size} hashes)", "")
    last = mine[-1]
    item = HistoryProof(last, tuple(inclusion_proof(last.index, n, tree.get)))
    wire = json.dumps(item.to_dict(), separators=(",", ":"))
    row("one entry + its proof as JSON", len(wire), "B", "")


def bench_proofs(
    tree: Tree, leaves: list[bytes], mine: list[LogEntry], rounds: int
) -> None:
    n, get, rng = tree.size, tree.get, random.Random(1)
    picks = [rng.randrange(n) for _ in range(rounds)]
    olds = [rng.randrange(1, n) for _ in range(rounds)]
    inc = [(i, inclusion_proof(i, n, get)) for i in picks[:200]]
    con = [
        (o, consistency_proof(o, n, get), Frontier.at(o, get).root())
        for o in olds[:200]
    ]
    it = iter(range(10**9))
    cp = Checkpoint("bench/log", n, tree.root)
    mine = mine[-20:]
    history = [HistoryProof(e, tuple(inclusion_proof(e.index, n, get))) for e in mine]

    def check_inclusion() -> None:
        i, proof = inc[next(it) % len(inc)]
        verify_inclusion(leaves[i], i, n, proof, tree.root)

    def check_consistency() -> None:
        old, proof, old_root = con[next(it) % len(con)]
        verify_consistency(old, n, old_root, tree.root, proof)

    def check_history() -> None:
        first, last = mine[0].index, mine[-1].index
        verify_history(mine[0].node_uuid, history, cp, complete_from=first, last=last)

    print(f"\nmedian µs at N = {n:,} ({rounds} rounds)")
    row(
        "build inclusion proof",
        median_us(lambda: inclusion_proof(picks[next(it) % rounds], n, get), rounds),
        "µs",
    )
    row(
        "build consistency proof",
        median_us(lambda: consistency_proof(olds[next(it) % rounds], n, get), rounds),
        "µs",
    )
    row("verify inclusion proof", median_us(check_inclusion, rounds), "µs")
    row("verify consistency proof", median_us(check_consistency, rounds), "µs")
    row(
        f"verify a history of {len(history)} entries",
        median_us(check_history, rounds // 10),
        "µs",
    )


def bench_checkpoint(tree: Tree, rounds: int) -> None:
    key = ed25519.Ed25519PrivateKey.generate()
    public, name = key.public_key(), log_origin(key.public_key())
    cp = Checkpoint(name, tree.size, tree.root)
    note = sign_checkpoint(cp, key, name)
    print("\ncheckpoint (C2SP signed note, Ed25519)")
    row("sign", median_us(lambda: sign_checkpoint(cp, key, name), rounds), "µs")
    row(
        "open (parse + verify)",
        median_us(lambda: open_checkpoint(note, public, name, name), rounds),
        "µs",
    )
    row("note size", len(note.encode()), "B", "")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--entries", type=int, default=1_000_000)
    ap.add_argument("--every", type=int, default=20_000, help="one node's spacing")
    ap.add_argument("--rounds", type=int, default=2000)
    args = ap.parse_args()
    print(f"python {platform.python_version()} on {platform.machine()}")
    tree, leaves, mine = bench_append(args.entries, args.every)
    bench_sizes(tree, mine)
    bench_proofs(tree, leaves, mine, args.rounds)
    bench_checkpoint(tree, args.rounds)


if __name__ == "__main__":
    main()
