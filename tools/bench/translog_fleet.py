#!/usr/bin/env python3
"""The attestation log's cost in the verifier service, and a history query
among 10^6 entries (issue 30 item 2).

1. Checks per second with and without the log, in the same run: a polled
   check of an attested node in process (tools/bench/round_cost.py's
   method: answers made beforehand, SQLite), once as shipped and once with
   the log's staging switched off. An unchanged good quote stages nothing,
   so both run the same code; the figure shows it.
2. Churn: the cost of a verdict CHANGE (a node failing and recovering:
   two signed events, two outbox rows) with and without its log entry,
   and the sequencer's cost per entry (leaf, stored subtrees, a signed
   checkpoint per batch). Parts 1 and 2 count this process's CPU time,
   which other load on the machine barely changes (wall time on a shared
   2-core machine varied by 2x between identical runs). From these, the
   share of the checks per second a fleet loses at a given rate of
   changes per check.
3. History query: one node's history with its inclusion proofs, among
   ``--entries`` entries (10^6 by default) in SQLite, filled by bulk
   insert (``--nodes`` nodes, entries spread evenly).

Not a test: nothing is asserted.

    .venv/bin/python tools/bench/translog_fleet.py [--n 500] [--rounds 5]
        [--changes 300] [--entries 1000000] [--nodes 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
import types
import uuid as uuid_mod
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(_HERE)))

import sqlalchemy as sa  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ed25519  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

import verifier.attest.store as store_module  # noqa: E402
from verifier.attest.node import NodeState  # noqa: E402
from verifier.db import LogEntryRow, LogHead, LogNode, make_engine, upgrade  # noqa: E402
from verifier.protocol import translog  # noqa: E402
from verifier.protocol.attestation import Action, Transition, Verdict  # noqa: E402
from verifier.tlog.reads import LogReader  # noqa: E402
from verifier.tlog.sequencer import HEAD_ID, LogSequencer  # noqa: E402

#: CPU time of this process: other load on the machine (other services,
#: other benchmarks) barely changes it, as it does wall time.
_cpu = time.process_time


def _round_cost() -> Any:
    spec = importlib.util.spec_from_file_location(
        "round_cost", os.path.join(_HERE, "round_cost.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # its timer: CPU time
    setattr(module, "time", types.SimpleNamespace(perf_counter=_cpu))  # noqa: B010
    return module


class _LogOff:
    """Switches the log's staging off in the store (the "without" runs)."""

    def __enter__(self) -> None:
        self._saved = getattr(store_module, "stage_note")  # noqa: B009
        setattr(store_module, "stage_note", lambda *a, **k: None)  # noqa: B010

    def __exit__(self, *exc: object) -> None:
        setattr(store_module, "stage_note", self._saved)  # noqa: B010


async def _changes(verifier: Any, uuid: str, count: int) -> float:
    """Microseconds per verdict change: ``count`` changes, attested ->
    failed -> attested (recovered) ..., each written as the service does."""
    node = verifier.nodes.live(uuid)
    failed = Verdict(Action.FAIL, Transition(NodeState.FAILED, "bench", "churn"))
    back = Verdict(Action.WAIT, Transition(NodeState.ATTESTED))
    t0 = _cpu()
    for i in range(count):
        verifier.transitions.act(node, failed if i % 2 == 0 else back)
    return (_cpu() - t0) / count * 1e6


async def _service(args: argparse.Namespace) -> dict[str, float]:
    rc = _round_cost()
    figures: dict[str, list[float]] = {"on": [], "off": []}
    for i in range(2 * args.repeat):  # on, off, off, on, ...: drift hits both
        if (i + i // 2) % 2 == 0:
            figures["on"] += await rc._checks(args.n, args.rounds, 0)
        else:
            with _LogOff():
                figures["off"] += await rc._checks(args.n, args.rounds, 0)
        rc.pull_module.os = os  # round_cost leaves its nonces in place
    # the least disturbed round of each (other load only ever adds time)
    out = {f"check_{k}": min(v) for k, v in figures.items()}
    out |= {f"check_{k}_median": statistics.median(v) for k, v in figures.items()}
    # churn: a verifier with one attested node, changes written for real
    workdir = tempfile.mkdtemp(prefix="bench-tlog-")
    engine = make_engine(f"sqlite:///{workdir}/verifier.sqlite")
    upgrade(engine)
    agent = rc.FakeAgent("7e57ab1e-0000-4000-8000-000000000002", 9001)
    registrar = rc.FakeRegistrar()
    registrar.add(agent)
    verifier = rc._verifier(engine, registrar, rc.FakeAgents(agent))
    from verifier.protocol import PcrPolicy

    good = rc.VerifierServiceBase._good_pcr16()
    await verifier.commands.enrol(
        agent.uuid, os.urandom(32), PcrPolicy({16: frozenset({good})})
    )
    verifier.pause_attestation()
    await verifier.rounds.attest_once(agent.uuid)
    on, off = [], []
    for _ in range(args.repeat):
        on.append(await _changes(verifier, agent.uuid, args.changes))
        with _LogOff():
            off.append(await _changes(verifier, agent.uuid, args.changes))
    out["change_on"], out["change_off"] = statistics.median(on), statistics.median(off)
    sequencer = LogSequencer(engine, ed25519.Ed25519PrivateKey.generate())
    with Session(engine) as session:
        staged = session.scalar(
            sa.select(sa.func.count()).where(LogEntryRow.leaf_index.is_(None))
        )
    t0 = _cpu()
    appended = sequencer.sequence_all()
    out["sequence_per_entry"] = (_cpu() - t0) / max(appended, 1) * 1e6
    out["staged"] = float(staged or 0)
    await verifier.stop()
    engine.dispose()
    return out


def _fill(engine: sa.Engine, entries: int, nodes: int) -> tuple[str, int]:
    """``entries`` sequenced entries of ``nodes`` nodes (round robin), by
    bulk insert; returns one node's UUID and how many entries it has."""
    key = ed25519.Ed25519PrivateKey.generate()
    uuids = [str(uuid_mod.UUID(int=i + 1)) for i in range(nodes)]
    frontier = translog.Frontier()
    last: dict[str, int] = {}
    rows: list[dict[str, Any]] = []
    subtrees: list[dict[str, Any]] = []
    base = 1_700_000_000.0

    def flush() -> None:
        with engine.begin() as conn:
            if rows:
                conn.execute(sa.insert(LogEntryRow), rows)
            if subtrees:
                conn.execute(sa.insert(LogNode), subtrees)
        rows.clear()
        subtrees.clear()

    kinds = (translog.EntryKind.RECOVERED, translog.EntryKind.UNREACHABLE)
    for index in range(entries):
        uuid = uuids[index % nodes]
        entry = translog.LogEntry(
            index, last.get(uuid), uuid, "bench-project",
            kinds[index % 2],
            "unreachable", "missed 5 rounds", base + index, str(uuid_mod.uuid4()),
        )  # fmt: skip
        last[uuid] = index
        body = entry.to_bytes()
        for level, idx, digest in frontier.append(translog.leaf_hash(body)):
            subtrees.append({"level": level, "idx": idx, "hash": digest})
        rows.append(
            {
                "leaf_index": index, "prev_index": entry.prev, "node_uuid": uuid,
                "project_id": "bench-project", "created_at": entry.created_at,
                "kind": entry.kind.value, "body": body, "pruned": False,
            }
        )  # fmt: skip
        if len(rows) >= 20_000:
            flush()
    flush()
    origin = translog.log_origin(key.public_key())
    note = translog.sign_checkpoint(
        translog.Checkpoint(origin, frontier.size, frontier.root()), key, origin
    )
    with engine.begin() as conn:
        conn.execute(
            sa.insert(LogHead).values(
                id=HEAD_ID, size=frontier.size, frontier=json.dumps(frontier.to_dict()),
                root=frontier.root(), checkpoint=note, pruned_below=0,
                updated_at=time.time(),
            )
        )  # fmt: skip
    return uuids[nodes // 2], entries // nodes


def _history(args: argparse.Namespace) -> dict[str, float]:
    if args.history_db:  # filled by an earlier run (kept with --keep)
        path = args.history_db
        engine = make_engine(f"sqlite:///{path}")
        uuid, per_node = (
            str(uuid_mod.UUID(int=args.nodes // 2 + 1)),
            args.entries // args.nodes,
        )
        filled = 0.0
    else:
        path = os.path.join(tempfile.mkdtemp(prefix="bench-tlog-history-"), "v.sqlite")
        engine = make_engine(f"sqlite:///{path}")
        upgrade(engine)
        t0 = time.perf_counter()
        uuid, per_node = _fill(engine, args.entries, args.nodes)
        filled = time.perf_counter() - t0
    reader = LogReader(engine)
    times = []
    for _ in range(args.queries):
        t0 = time.perf_counter()
        history = reader.history(uuid, "bench-project")
        times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    size = len(json.dumps(history.to_dict()))
    since = reader.history(uuid, None, since=1_700_000_000.0 + args.entries * 0.9)
    since_ms = (time.perf_counter() - t0) * 1e3
    engine.dispose()
    db_bytes = os.path.getsize(path)
    if not args.history_db and not args.keep:
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)
    elif not args.history_db:
        print(f"(database kept: --history-db {path})")
    return {
        "fill_s": filled,
        "per_node": float(per_node),
        "query_ms": statistics.median(times) * 1e3,
        "answer_bytes": float(size),
        "since_ms": since_ms,
        "since_entries": float(len(since.entries)),
        "db_mib": db_bytes / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=500, help="checks per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--changes", type=int, default=300)
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=20)
    parser.add_argument("--history-db", help="reuse a database filled before")
    parser.add_argument("--keep", action="store_true", help="keep the filled one")
    parser.add_argument("--skip-service", action="store_true",
                        help="only the history query")  # fmt: skip
    parser.add_argument("--skip-history", action="store_true",
                        help="only the service's figures")  # fmt: skip
    parser.add_argument("--churn", type=float, default=0.01,
                        help="changes per check for the estimate")  # fmt: skip
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # one line per change otherwise
    if not args.skip_service:
        _print_service(args, asyncio.run(_service(args)))
    if not args.skip_history:
        _print_history(args, _history(args))


def _print_service(args: argparse.Namespace, svc: dict[str, float]) -> None:
    on, off = svc["check_on"], svc["check_off"]
    print(
        f"polled check in process (CPU): {on:.1f} us with the log, {off:.1f} us "
        f"without ({1e6 / on:,.0f} vs {1e6 / off:,.0f} checks/s per core, "
        f"{(on - off) / off * 100:+.1f} %; best rounds; medians "
        f"{svc['check_on_median']:.1f} and {svc['check_off_median']:.1f} us; an "
        f"unchanged quote stages nothing)"
    )
    # a difference below 0 is the noise of the commits (fsync): count 0
    staging = max(0.0, svc["change_on"] - svc["change_off"])
    extra = staging + svc["sequence_per_entry"]
    print(
        f"verdict change (signed event + outbox, failed/recovered; CPU): "
        f"{svc['change_on']:.0f} us with its log entry, {svc['change_off']:.0f} us "
        f"without; sequencing {svc['sequence_per_entry']:.0f} us per entry "
        f"({svc['staged']:.0f} entries, one signed checkpoint per batch)"
    )
    loss = args.churn * extra / (on + args.churn * (svc["change_off"])) * 100
    print(
        f"at {args.churn:g} changes per check the log costs {loss:.2f} % of the "
        f"checks per second ({staging:.0f} us staging + "
        f"{svc['sequence_per_entry']:.0f} us sequencing per change)"
    )


def _print_history(args: argparse.Namespace, hist: dict[str, float]) -> None:
    print(
        f"history of one node ({hist['per_node']:.0f} entries with proofs) among "
        f"{args.entries:,} entries of {args.nodes:,} nodes: median "
        f"{hist['query_ms']:.1f} ms over {args.queries} queries "
        f"({hist['answer_bytes'] / 1024:.0f} KiB of JSON); with since "
        f"({hist['since_entries']:.0f} entries): {hist['since_ms']:.1f} ms; "
        f"filled in {hist['fill_s']:.0f} s, database {hist['db_mib']:.0f} MiB"
    )


if __name__ == "__main__":
    main()
