#!/usr/bin/env python3
"""The verifier service's cost of one polled check, in process: the round
dispatch, the agent client's answer, the pure core's judgement and the
write-ahead path (``rounds.attest_once`` on a node that is attested),
against a SQLite database.

The agent's answers are made before the measurement (a software TPM
quotes each precomputed nonce in turn) and handed back by a stand-in
client, so what is counted is the verifier's work alone. Prints the median
microseconds per check over several rounds; with ``--callgrind`` instead
runs itself twice under valgrind's callgrind (N and 2N checks) and prints
the instructions per check (the difference over N), which do not depend
on what else the machine does. Not a test: nothing is asserted.

    .venv/bin/python tools/bench/round_cost.py [--n 500] [--rounds 5]
    .venv/bin/python tools/bench/round_cost.py --callgrind [--n 300]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))

from cryptography.hazmat.primitives.asymmetric import ed25519  # noqa: E402

import verifier.attest.pull as pull_module  # noqa: E402
from verifier.attest.service import Verifier  # noqa: E402
from verifier.db import make_engine, upgrade  # noqa: E402
from verifier.notify import Outbox  # noqa: E402
from verifier.protocol import PcrPolicy  # noqa: E402
from verifier.tests.unit.test_attest_service import (  # noqa: E402
    FakeAgent,
    FakeAgents,
    FakeRegistrar,
    VerifierServiceBase,
)


class _Nonces:
    """Stands in for the ``os`` module of the pull round: its nonces are
    the precomputed ones, in order."""

    def __init__(self, nonces: Iterator[bytes]) -> None:
        self._nonces = nonces

    def urandom(self, n: int) -> bytes:
        return next(self._nonces)


class _Answers(FakeAgents):
    """Hands back the answer made beforehand for each nonce."""

    def __init__(self, agent: FakeAgent) -> None:
        super().__init__(agent)
        self.ready: dict[str, Mapping[str, Any]] = {}

    async def call(
        self,
        method: str,
        base: str,
        agent_cert: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
    ) -> Mapping[str, Any]:
        if params is not None and params.get("nonce") in self.ready:
            return self.ready.pop(params["nonce"])
        return await super().call(
            method, base, agent_cert, path, params=params, body=body
        )


def _verifier(engine: Any, registrar: FakeRegistrar, agents: FakeAgents) -> Verifier:
    key = ed25519.Ed25519PrivateKey.generate()
    try:
        from verifier.attest.settings import VerifierSettings
    except ImportError:  # the service before its settings object
        return Verifier(engine, key, registrar, agents, Outbox(engine, []), None,
                        interval=3600.0)  # type: ignore[arg-type,call-arg]  # fmt: skip
    return Verifier(
        engine, key, registrar, agents,  # type: ignore[arg-type]
        Outbox(engine, []), None, VerifierSettings(interval=3600.0),
    )  # fmt: skip


async def _checks(n: int, rounds: int, made: int) -> list[float]:
    """Microseconds per check, one figure per round of ``n`` checks, with
    ``made`` answers made beforehand (at least ``n * rounds``)."""
    workdir = tempfile.mkdtemp(prefix="bench-round-")
    engine = make_engine(f"sqlite:///{workdir}/verifier.sqlite")
    upgrade(engine)
    agent = FakeAgent("7e57ab1e-0000-4000-8000-000000000001", 9000)
    registrar = FakeRegistrar()
    registrar.add(agent)
    agents = _Answers(agent)
    verifier = _verifier(engine, registrar, agents)
    commands = getattr(verifier, "commands", verifier)
    rounds_of = getattr(verifier, "rounds", verifier)
    live = getattr(verifier, "nodes", verifier).live
    good = VerifierServiceBase._good_pcr16()
    await commands.enrol(agent.uuid, os.urandom(32), PcrPolicy({16: frozenset({good})}))
    verifier.pause_attestation()
    await rounds_of.attest_once(agent.uuid)  # V released: attested from now on
    node = live(agent.uuid)
    nonces = [os.urandom(20) for _ in range(max(made, n * rounds))]
    for nonce in nonces:  # the agent's answers, made beforehand
        query = node.request(nonce).to_query()
        agents.ready[query["nonce"]] = await agent.quote(query)
    pull_module.os = _Nonces(iter(nonces))  # type: ignore[assignment]
    figures = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            await rounds_of.attest_once(agent.uuid)
        figures.append((time.perf_counter() - t0) / n * 1e6)
    view = await getattr(verifier, "queries", verifier).get(agent.uuid)
    assert view.state == "attested", view
    await verifier.stop()
    return figures


def _callgrind(n: int) -> float:
    """Instructions per check: callgrind's totals for 2n and n checks
    (both runs make the same 2n answers beforehand)."""
    totals = []
    for count in (n, 2 * n):
        cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
               sys.executable, __file__, "--n", str(count), "--rounds", "1",
               "--made", str(2 * n)]  # fmt: skip
        env = dict(os.environ, PYTHONHASHSEED="0")  # the same hashing each run
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
        found = re.search(r"Collected : (\d+)", out.stderr)
        assert found is not None, out.stderr[-2000:]
        totals.append(int(found.group(1)))
    return (totals[1] - totals[0]) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--callgrind", action="store_true")
    parser.add_argument("--made", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.callgrind:
        per = _callgrind(args.n)
        print(f"verifier instructions per polled check (callgrind): {per:,.0f}")
        return
    figures = asyncio.run(_checks(args.n, args.rounds, args.made))
    print(
        f"verifier service, one polled check in process: median "
        f"{statistics.median(figures):.1f} us over {args.rounds} rounds of "
        f"{args.n} (min {min(figures):.1f}, max {max(figures):.1f})"
    )


if __name__ == "__main__":
    main()
