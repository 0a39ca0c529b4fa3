#!/usr/bin/env python3
"""Scrape cost of the verifier's ``GET /metrics`` at scale (issue 30).

Fills a verifier database with N attested nodes (as tools/bench/memory.py
does) and a backlog of undelivered outbox events, starts the real
``Verifier`` service on it in this process with agents that never answer,
gives every counter and histogram the label values a busy verifier has
(both modes, every failure reason, every transition kind), then scrapes
``GET /metrics`` through the real aiohttp application and prints per
scrape: the median time (the gauges computed from the live table and the
outbox, and the registry rendered), the time of the gauges alone, and the
size of the answer in the Prometheus text format and in OpenMetrics. Not a
test: nothing is asserted.

    .venv/bin/python tools/bench/metrics_scrape.py [--n 10000 100000] [--scrapes 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import sys
import tempfile
import time
import uuid as uuid_mod

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))

from collections.abc import Mapping  # noqa: E402
from typing import Any  # noqa: E402

import sqlalchemy as sa  # noqa: E402
from aiohttp.test_utils import TestClient, TestServer  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ed25519  # noqa: E402
from oslo_config import cfg  # noqa: E402

from trusted_testing.auth import open_auth  # noqa: E402
from trusted_testing.bench_nodes import Silent, attested_row, ecc_ak  # noqa: E402
from verifier import db  # noqa: E402
from verifier.api.verifier_app import make_app  # noqa: E402
from verifier.attest.service import Verifier  # noqa: E402
from verifier.attest.settings import VerifierSettings  # noqa: E402
from verifier.common import metrics  # noqa: E402
from verifier.common.plugins import Notifier  # noqa: E402
from verifier.notify import Outbox  # noqa: E402

OPENMETRICS = "application/openmetrics-text; version=1.0.0"


class Refusing(Notifier):
    """A consumer that never acknowledges: the backlog stays."""

    name = "refusing"

    def _deliver(self, event: Mapping[str, Any]) -> bool:
        return False


def verifier_on(engine: sa.Engine) -> Verifier:
    """The real verifier service, its agents never answering and its
    outbox never delivered."""
    key = ed25519.Ed25519PrivateKey.generate()
    refusing = Refusing(cfg.ConfigOpts(), key.public_key())
    return Verifier(
        engine,
        key,
        Silent(),  # type: ignore[arg-type]
        Silent(),  # type: ignore[arg-type]
        Outbox(engine, [refusing], retry_delay=3600),
        None,
        VerifierSettings(interval=2.0),
    )


def fill(url: str, n: int, backlog: int) -> None:
    engine = db.make_engine(url)
    db.upgrade(engine)
    policy = json.dumps({"hash": "sha256", "pcrs": {"16": ["00" * 32]}})
    now = time.time()
    ak = ecc_ak()  # one AK for all: only the table's size matters here
    rows = [attested_row(i, policy, ak, now) for i in range(n)]
    events = [
        {
            "id": str(uuid_mod.uuid4()),
            "node_uuid": rows[i % n]["uuid"],
            "project_id": "",
            "body": "{}",
            "created_at": now - 60,
            "attempts": 1,
        }
        for i in range(backlog)
    ]
    with engine.begin() as conn:
        conn.execute(db.Node.__table__.insert(), rows)
        conn.execute(db.OutboxEvent.__table__.insert(), events)
    engine.dispose()


def busy_labels() -> None:
    """Every label value a busy verifier has counted (the series exist)."""
    for mode in ("pull", "push"):
        metrics.attestation(mode, True, None)
        metrics.QUOTE_ROUND.labels(mode).observe(0.01)
        for reason in sorted(metrics.REASONS | {"other"}):
            metrics.attestation(mode, False, reason)
    for kind in ("failed", "unreachable", "recovered"):
        for reason in sorted(metrics.REASONS | {"other"}):
            metrics.transition(kind, reason)
    for step in ("opened", "granted"):
        metrics.push_session(step)


async def scrape(url: str, n: int, scrapes: int) -> dict[str, float]:
    engine = db.make_engine(url)
    verifier = verifier_on(engine)
    await verifier.start()
    await asyncio.sleep(1)
    assert len(verifier.nodes) == n, len(verifier.nodes)
    app = make_app(verifier, "PEM", open_auth())
    out: dict[str, float] = {}
    async with TestClient(TestServer(app)) as client:
        times, gauges = [], []
        for _ in range(scrapes):
            t0 = time.perf_counter()
            resp = await client.get("/metrics")
            text = await resp.read()
            times.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            await verifier.gauges.refresh()
            gauges.append(time.perf_counter() - t0)
        resp = await client.get("/metrics", headers={"Accept": OPENMETRICS})
        om = await resp.read()
    await verifier.stop()
    engine.dispose()
    out["scrape_ms"] = statistics.median(times) * 1000
    out["gauges_ms"] = statistics.median(gauges) * 1000
    out["text_bytes"] = len(text)
    out["om_bytes"] = len(om)
    out["series"] = sum(
        1 for line in text.decode().splitlines() if line and not line.startswith("#")
    )
    return out


def hot_path_us(calls: int = 200_000) -> tuple[float, float]:
    """CPU microseconds of the counting one check costs (a pass, a
    failure): ``metrics.judged`` as the pull round calls it, median of 5
    runs (process CPU time: other load on the machine barely changes it;
    compare with fleet.py's verifier CPU per check)."""
    from verifier.protocol.attestation import (  # noqa: PLC0415
        Action,
        NodeState,
        Transition,
        Verdict,
    )

    good = Verdict(Action.WAIT)
    bad = Verdict(Action.REVOKE, Transition(NodeState.REVOKED, "pcr_policy", "x"))
    out = []
    for verdict in (good, bad):
        runs = []
        for _ in range(5):
            started = time.perf_counter()
            t0 = time.process_time()
            for _ in range(calls):
                metrics.judged("pull", verdict, started)
            runs.append((time.process_time() - t0) / calls * 1e6)
        out.append(statistics.median(runs))
    return out[0], out[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[10000])
    parser.add_argument("--scrapes", type=int, default=20)
    parser.add_argument("--backlog", type=int, default=100)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # the refused deliveries
    busy_labels()
    print(
        "GET /metrics of one verifier process (in-process client, loopback "
        f"HTTP), median of {args.scrapes} scrapes; {args.backlog} undelivered "
        "outbox events; every mode, result, reason and kind counted"
    )
    print(
        f"  {'nodes':>7}  {'scrape ms':>9}  {'gauges ms':>9}  {'series':>6}  "
        f"{'text KB':>7}  {'OpenMetrics KB':>14}"
    )
    good, bad = hot_path_us()
    print(
        f"  CPU of counting one check (metrics.judged: counter + histogram): "
        f"{good:.2f} us passed, {bad:.2f} us failed"
    )
    for n in args.n:
        workdir = tempfile.mkdtemp(prefix="bench-metrics-")
        url = f"sqlite:///{workdir}/verifier.sqlite"
        fill(url, n, args.backlog)
        r = asyncio.run(scrape(url, n, args.scrapes))
        print(
            f"  {n:>7}  {r['scrape_ms']:>9.2f}  {r['gauges_ms']:>9.2f}  "
            f"{int(r['series']):>6}  {r['text_bytes'] / 1024:>7.1f}  "
            f"{r['om_bytes'] / 1024:>14.1f}"
        )


if __name__ == "__main__":
    main()
