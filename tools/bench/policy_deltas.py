#!/usr/bin/env python3
"""Verifier memory and judging cost of runtime policy deltas (issue 28).

A whole-image policy (by default the first 60,000 regular files under
/usr, each with a SHA-256 digest: real paths, synthetic digests) is
version 1; versions 2, 3 and 4 each patch 500 paths (half of them files the
image already has, with a new digest, half new files). They are stored in a
real ``PolicyStore`` (SQLite) two ways:

* as deltas: v2 over v1, v3 over v2, v4 over v3;
* as four full policies (what a tenant stores without deltas).

For each way the script reports the bytes stored, and the Python heap
(``tracemalloc``) held by a cold store's cache after loading the four
versions plus 10,000 node records referencing them (2,500 nodes per
version), each holding what a verifier's ``LiveNode`` holds for its
runtime policy: the digest read from its database row and a reference to
the shared parsed object. Then the judging cost per entry
(``evaluate()``) of the full v4 and of the composed v4 (three deltas over
the base), over a list of entries all allowed. Not a test: nothing is
asserted.

    .venv/bin/python tools/bench/policy_deltas.py [--paths 60000] \\
        [--delta-paths 500] [--nodes 10000] [--root /usr]
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import os
import random
import sys
import tempfile
import timeit
import tracemalloc
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))

import sqlalchemy as sa  # noqa: E402

from node_agent.trial.ima import make_entry  # noqa: E402
from verifier.attest.policies import PolicyStore  # noqa: E402
from verifier.db import StoredPolicy, make_engine, upgrade  # noqa: E402
from verifier.protocol.ima import RuntimePolicy, evaluate  # noqa: E402

RUNTIME = "runtime"


def _paths(root: str, n: int) -> list[str]:
    """``n`` real file paths under ``root`` (synthetic ones if too few)."""
    out: list[str] = []
    for directory, _, files in os.walk(root):
        for name in sorted(files):
            path = os.path.join(directory, name)
            if os.path.isfile(path) and not os.path.islink(path):
                out.append(path)
                if len(out) == n:
                    return out
    out += [f"/usr/lib/synthetic/f{i}.so" for i in range(n - len(out))]
    return out


def _digest(path: str, generation: int) -> str:
    return (
        "sha256:" + hashlib.sha256(b"%d:%s" % (generation, path.encode())).hexdigest()
    )


def _documents(paths: list[str], per_delta: int) -> tuple[list[Any], list[Any]]:
    """The four versions, as deltas (without "base" yet) and as full docs."""
    rng = random.Random(28)
    full = {p: [_digest(p, 0)] for p in paths}
    deltas: list[dict[str, Any]] = [{"name": "image", "version": 1, "digests": full}]
    fulls: list[dict[str, Any]] = [{"name": "image", "version": 1, "digests": full}]
    for version in (2, 3, 4):
        patched = rng.sample(paths, per_delta // 2)
        new = [f"/usr/lib/patch{version}/f{i}.so" for i in range(per_delta // 2)]
        own = {p: [_digest(p, version)] for p in patched + new}
        deltas.append({"name": "image", "version": version, "digests": own})
        full = dict(full)
        for p, d in own.items():
            full[p] = sorted(set(full.get(p, [])) | set(d))
        fulls.append({"name": "image", "version": version, "digests": full})
    return deltas, fulls


class _NodeRefs:
    """What a ``LiveNode`` holds for its runtime policy."""

    __slots__ = ("runtime", "runtime_ref")

    def __init__(self, runtime_ref: str, runtime: object) -> None:
        self.runtime_ref = runtime_ref
        self.runtime = runtime


def _store(workdir: str, name: str, docs: list[Any], chain: bool) -> tuple[Any, ...]:
    engine = make_engine(f"sqlite:///{workdir}/{name}.db")
    upgrade(engine)
    store = PolicyStore(engine)
    digests: list[str] = []
    for doc in docs:
        if chain and digests:
            doc = {**doc, "base": digests[-1]}
        meta, _ = store.add(RUNTIME, doc, project="p")
        digests.append(meta["digest"])
    stored = sum(m["entries"] for m in store.list(RUNTIME, "p"))
    with engine.connect() as conn:
        size = conn.scalar(sa.select(sa.func.sum(sa.func.length(StoredPolicy.body))))
    return engine, digests, stored, size


def _memory(engine: Any, digests: list[str], nodes: int) -> tuple[int, int, list[Any]]:
    """Heap bytes of a cold store's cache with ``nodes`` node records, and
    of the cache alone."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    store = PolicyStore(engine)
    for digest in digests:
        store.load(digest)
    gc.collect()
    cache = tracemalloc.get_traced_memory()[0] - before
    records = []
    for i in range(nodes):
        digest = digests[i % len(digests)]
        # a fresh str, as read from each node's row
        records.append(_NodeRefs("".join(digest), store.load(digest)))
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return used, cache, [store, records]


def _per_entry(policies: list[RuntimePolicy], entries: list[Any]) -> list[float]:
    """The best of 7 runs of each, interleaved (a busy machine slows both
    alike), in ns per entry."""
    for policy in policies:
        assert evaluate(policy, entries, 1) == []
    best = [float("inf")] * len(policies)
    for _ in range(7):
        for i, policy in enumerate(policies):
            run = timeit.timeit(lambda p=policy: evaluate(p, entries, 1), number=3)
            best[i] = min(best[i], run)
    return [b / 3 / len(entries) * 1e9 for b in best]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--paths", type=int, default=60_000)
    p.add_argument("--delta-paths", type=int, default=500)
    p.add_argument("--nodes", type=int, default=10_000)
    p.add_argument("--root", default="/usr")
    args = p.parse_args()
    paths = _paths(args.root, args.paths)
    deltas, fulls = _documents(paths, args.delta_paths)
    mib = 1 << 20
    with tempfile.TemporaryDirectory() as workdir:
        results = {}
        for label, docs, chain in (
            ("deltas", deltas, True),
            ("full copies", fulls, False),
        ):
            engine, digests, entries, size = _store(workdir, label, docs, chain)
            heap, cache, keep = _memory(engine, digests, args.nodes)
            results[label] = (digests, heap, keep)
            print(
                f"{label:12s}: 4 versions, {entries} path entries stored, "
                f"{size / mib:.1f} MiB of JSON; heap: {cache / mib:.1f} MiB "
                f"(the store's cache), {heap / mib:.1f} MiB with {args.nodes} "
                f"nodes ({(heap - cache) / args.nodes:.0f} bytes per node)"
            )
            del keep
        d_heap, f_heap = results["deltas"][1], results["full copies"][1]
        print(
            f"deltas / full copies: {d_heap / f_heap:.2f} "
            f"({(f_heap - d_heap) / mib:.1f} MiB saved)"
        )
        store, records = results["deltas"][2]
        composed = store.load(results["deltas"][0][-1])
        flat = results["full copies"][2][0].load(results["full copies"][0][-1])
        assert (
            composed.base.base.base._allow is store.load(results["deltas"][0][0])._allow
        )
        print(
            f"base's allowlist shared by the composed v4: True; {len(composed)} paths"
        )
        rng = random.Random(1)
        sample = rng.sample(sorted(fulls[-1]["digests"]), min(20_000, len(paths)))
        log = [
            make_entry(path, digest=bytes.fromhex(fulls[-1]["digests"][path][-1][7:]))
            for path in sample
        ]
        t_full, t_delta = _per_entry([flat, composed], log)
        print(
            f"evaluate() per entry ({len(log)} allowed entries): full v4 "
            f"{t_full:.0f} ns, composed v4 (3 deltas) {t_delta:.0f} ns "
            f"({t_delta / t_full:.2f}x)"
        )


if __name__ == "__main__":
    main()
