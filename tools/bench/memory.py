#!/usr/bin/env python3
"""Verifier memory per enrolled node (aim: <= 8 KB per node, issue 19).

Fills a verifier database with N enrolled, attested nodes (distinct ECC
P-256 AKs from software TPMs, one shared PCR policy as a real tenant would
use), then starts the real ``Verifier`` service on it in this process, with
an agent client whose requests never complete (so every node is loaded and
scheduled but no network traffic happens), and reports the growth of the
process's resident memory divided by N.

    .venv/bin/python tools/bench/memory.py [--n 10000 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))

from cryptography.hazmat.primitives.asymmetric import ec, ed25519  # noqa: E402

from trusted_testing.procstat import rss_kib  # noqa: E402
from trusted_testing.softtpm import AK_ATTRIBUTES  # noqa: E402
from verifier import db  # noqa: E402
from verifier.attest.service import Verifier  # noqa: E402
from verifier.attest.settings import VerifierSettings  # noqa: E402
from verifier.notify import Outbox  # noqa: E402
from verifier.protocol import tpm as t  # noqa: E402

_CERT = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


class _Silent:
    """An agent client whose requests never finish (no traffic at all)."""

    async def call(self, *args: Any, **kwargs: Any) -> Any:
        await asyncio.Event().wait()

    def forget(self, base: str, agent_cert: str) -> None:
        pass

    def rest(self, base: str, delay: float) -> None:
        pass

    async def get_agent(self, uuid: str) -> Any:
        raise AssertionError("not used")

    async def close(self) -> None:
        pass


def fill(url: str, n: int) -> None:
    engine = db.make_engine(url)
    db.upgrade(engine)
    policy = json.dumps({"hash": "sha256", "pcrs": {"16": ["00" * 32]}})
    now = time.time()
    rows = []
    for i in range(n):
        key = ec.generate_private_key(ec.SECP256R1()).public_key()
        ak = t.make_public(key, AK_ATTRIBUTES, (t.ALG_ECDSA, t.ALG_SHA256))
        rows.append(
            {
                "uuid": f"00000000-0000-4000-8000-{i:012d}",
                "state": "attested",
                "policy": policy,
                "v_share": os.urandom(32),
                "ak_public": ak.to_bytes(),
                "tls_cert": _CERT,
                "host": f"127.2.{i // 250}.{i % 250 + 1}",
                "port": 9,
                "reset_count": 0,
                "restart_count": 0,
                "clock": 1000,
                "quotes_verified": 1,
                "v_released": True,
                "created_at": now,
                "updated_at": now,
            }
        )
    with engine.begin() as conn:
        conn.execute(db.Node.__table__.insert(), rows)
    engine.dispose()


async def measure(url: str, n: int) -> float:
    engine = db.make_engine(url)
    gc.collect()
    before = rss_kib()
    verifier = Verifier(
        engine,
        ed25519.Ed25519PrivateKey.generate(),
        _Silent(),  # type: ignore[arg-type]
        _Silent(),
        Outbox(engine, []),
        None,
        VerifierSettings(interval=2.0),
    )  # type: ignore[arg-type]
    await verifier.start()
    await asyncio.sleep(1)
    for node in verifier.nodes:
        node.ak.key  # noqa: B018 (what a verification builds)
    gc.collect()
    after = rss_kib()
    assert len(verifier.nodes) == n, len(verifier.nodes)
    await verifier.stop()
    return (after - before) * 1024 / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[10000])
    args = parser.parse_args()
    print(
        "verifier resident memory per enrolled node (all nodes loaded and "
        "scheduled, one shared policy)"
    )
    for n in args.n:
        workdir = tempfile.mkdtemp(prefix="bench-memory-")
        url = f"sqlite:///{workdir}/verifier.sqlite"
        fill(url, n)
        per_node = asyncio.run(measure(url, n))
        print(f"  {n:>7} nodes: {per_node / 1024:6.2f} KB per node")


if __name__ == "__main__":
    main()
