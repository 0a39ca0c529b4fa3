#!/usr/bin/env python3
"""IMA measurement-list verification throughput and runtime-policy memory.

Builds a synthetic 100,000-entry ima-ng binary measurement list and the
policy allowing it, then reports entries verified per second (parse + PCR 10
replay in both banks + policy evaluation) for:

* the first, full verification of the whole list;
* the incremental steady state: N new entries per quote (default 100), each
  chunk parsed from its bytes alone and replayed from the kept ReplayState.

* checks under IMA load (issues 19 and 34): each check decodes and
  verifies an ECC P-256 quote (signature, nonce, PCR policy) and, from the
  agent's ``ima`` object (binary list, then ascii), parses and judges 100
  new entries against the shared policy of 100,000 paths, replayed from
  the node's kept state (``check_ima``) -- the protocol core's work per
  check, process CPU, beside the plain check (the quote alone) in the same
  run, with the ratio; without the HTTP exchange and JSON decoding.

Then builds a 1,000,000-path policy from its JSON form and reports the RSS
it costs, and that 1,000 nodes referencing it cost nothing more.

    .venv/bin/python tools/bench/ima.py [--entries 100000] [--chunk 100]
    .venv/bin/python tools/bench/ima.py --policy-paths 1000   # skip the 1M policy
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))

from node_agent.trial.ima import (  # noqa: E402
    boot_aggregate_entry,
    make_entry,
    pcr_values,
    to_ascii,
    to_binary,
)
from trusted_testing.procstat import rss_kib  # noqa: E402
from trusted_testing.softtpm import SoftTpm  # noqa: E402
from verifier import protocol as p  # noqa: E402
from verifier.protocol.evidence import check_ima, parse_ima_evidence  # noqa: E402
from verifier.protocol.ima import (  # noqa: E402
    ImaEntry,
    ReplayState,
    RuntimePolicy,
    check_against_pcr,
    evaluate,
    parse_binary,
    policy_from_log,
    replay,
)
from verifier.protocol.messages.quote import ImaPart  # noqa: E402


def verify_chunk(state: ReplayState, data: bytes, policy: RuntimePolicy) -> ReplayState:
    entries = parse_binary(data, state.count)
    failures = evaluate(policy, entries, state.count)
    if failures:
        raise SystemExit(f"unexpected failure: {failures[0]}")
    return replay(state, entries)


def under_load(log: list[ImaEntry], policy: RuntimePolicy, chunk: int, n: int) -> None:
    """Full checks, each a quote plus ``chunk`` new entries (binary list,
    then ascii), beside the plain check (the quote alone) in the same run:
    process CPU per check and the ratio to the plain check (issue 34)."""
    tpm = SoftTpm(ak_alg="ecc")
    tpm.extend(16, os.urandom(32))
    pcrs = p.PcrPolicy.from_dict({"pcrs": {"16": tpm.pcrs[16].hex()}})
    ak = p.AttestationKey(p.TpmPublic.from_bytes(tpm.ak.to_bytes()), True)
    nonce, nk = os.urandom(20), os.urandom(32)
    wire = tpm.quote(p.bind_nonce(nonce, nk), (16,)).to_dict()
    checks = (n - 1) // chunk
    parts = {
        form: [
            ImaPart(i * chunk, form(log[i * chunk : (i + 1) * chunk])).to_dict()
            for i in range(checks)
        ]
        for form in (to_binary, to_ascii)
    }

    def quote() -> None:
        p.verify_quote(
            p.Quote.from_dict(wire),
            ak=ak,
            qualifying_data=p.bind_nonce(nonce, nk),
            policy=pcrs,
            previous_clock=None,
        )

    def run(dicts: list[dict[str, object]] | None) -> float:
        state = ReplayState()
        t0 = time.process_time()
        for i in range(checks):
            quote()
            if dicts is not None:
                evidence = parse_ima_evidence(dicts[i])
                state = check_ima(state, evidence, {10: targets[i]}, policy)
        return (time.process_time() - t0) / checks * 1e6

    targets, state = [], ReplayState()
    for i in range(checks):
        state = replay(state, log[i * chunk : (i + 1) * chunk])
        targets.append(state.sha256)
    plain = min(run(None) for _ in range(3))
    print(
        f"checks under IMA load (CPU per check, one core, best of 3; ECC quote "
        f"+ {chunk} new entries against a {len(policy):,}-path policy):"
    )
    print(f"  plain (quote only)      {plain:>6.0f} us")
    for form, label in ((to_binary, "binary"), (to_ascii, "ascii")):
        us = min(run(parts[form]) for _ in range(3))
        print(
            f"  + {chunk} entries, {label:<6} {us:>6.0f} us = {us / plain:.2f}x plain "
            f"({(us - plain) / chunk:.2f} us per entry)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--chunk", type=int, default=100)
    parser.add_argument("--policy-paths", type=int, default=1_000_000)
    args = parser.parse_args()

    n = args.entries
    log = [boot_aggregate_entry([bytes(32)] * 10)]
    log += [
        make_entry(f"/usr/lib/x86_64-linux-gnu/lib{i}.so.1", b"%d" % i)
        for i in range(n - 1)
    ]
    data = to_binary(log)
    offsets = [0]
    for e in log:
        offsets.append(offsets[-1] + len(e.to_binary()))
    policy = policy_from_log(log, "bench", 1)
    quoted = pcr_values(log)[1]
    print(f"log: {n} ima-ng entries, {len(data) / 1e6:.1f} MB binary")

    t0 = time.perf_counter()
    state = verify_chunk(ReplayState(), data, policy)
    check_against_pcr(state, quoted)
    full = time.perf_counter() - t0
    print(f"full verification:        {n / full:>10,.0f} entries/s ({full:.3f} s)")

    for label, step in (("parse only", 0), ("replay only", 1), ("policy only", 2)):
        entries = parse_binary(data)
        t0 = time.perf_counter()
        if step == 0:
            parse_binary(data)
        elif step == 1:
            replay(ReplayState(), entries)
        else:
            evaluate(policy, entries)
        dt = time.perf_counter() - t0
        print(f"  {label:<23} {n / dt:>10,.0f} entries/s")

    chunk = args.chunk
    state = ReplayState()
    t0 = time.perf_counter()
    for start in range(0, n, chunk):
        end = min(start + chunk, n)
        state = verify_chunk(state, data[offsets[start] : offsets[end]], policy)
        check_against_pcr(state, state.sha256)  # one comparison per quote
    inc = time.perf_counter() - t0
    check_against_pcr(state, quoted)
    print(
        f"incremental ({chunk}/quote): {n / inc:>10,.0f} entries/s "
        f"({inc / (n / chunk) * 1e6:.0f} us per quote)"
    )

    under_load(log, policy, chunk, n)

    del log, data, policy, entries
    gc.collect()
    m = args.policy_paths
    gc.collect()
    before = rss_kib()
    digests = {
        f"/usr/lib/x86_64-linux-gnu/pkg{i // 100}/lib{i}.so": [
            "sha256:" + hashlib.sha256(b"%d" % i).hexdigest()
        ]
        for i in range(m)
    }
    doc = {"name": "big", "version": 1, "digests": digests, "excludes": ["/tmp/"]}
    with_json = rss_kib()
    t0 = time.perf_counter()
    big = RuntimePolicy.from_dict(doc)
    built = time.perf_counter() - t0
    del doc, digests
    gc.collect()
    after = rss_kib()
    table = big._allow  # measuring its exact size
    exact = sys.getsizeof(table) + sum(
        sys.getsizeof(k) + sys.getsizeof(v) for k, v in table.items()
    )
    nodes = [big for _ in range(1000)]  # every node's state holds a reference
    shared = rss_kib()
    print(
        f"policy of {len(big):,} paths: built from parsed JSON in {built:.2f} s; "
        f"objects {exact / 2**20:.0f} MiB ({exact / m:.0f} B/path); "
        f"RSS +{(after - before) / 1024:.0f} MiB after freeing the JSON "
        f"(+{(with_json - before) / 1024:.0f} MiB while the parsed JSON is held)"
    )
    print(
        f"  shared by {len(nodes)} nodes: RSS +{(shared - after) / 1024:.1f} MiB; "
        f"content digest {big.digest.hex()[:16]}..."
    )


if __name__ == "__main__":
    main()
