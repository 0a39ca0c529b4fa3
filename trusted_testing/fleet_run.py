"""An emulated fleet attested by the real services, for benchmarks and the
soak: the registrar and verifier(s) (:class:`LocalCluster`), the fleet
emulator process (:class:`FleetProcess`) and a client that enrols the
fleet and reads the verifier's node list and counters.

Used by ``tools/bench/fleet.py`` (throughput) and ``tools/bench/soak.py``
(false and missed revocations over time), which only differ in what they
do once every node is attested.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import time
from collections.abc import Iterator, Sequence
from typing import Any

import aiohttp
import orjson

from trusted_testing.cluster import LocalCluster
from trusted_testing.fleet import FleetProcess
from trusted_testing.fleet_ima import ImaLoad
from verifier.common import tls as tlsutil
from verifier.protocol import PcrPolicy
from verifier.protocol.attestation import AttestationMode
from verifier.protocol.messages.enrolment import EnrolmentBatch, EnrolmentRequest

__all__ = [
    "FleetApi",
    "keep_service_logs",
    "fleet_cluster",
    "mix_text",
    "mixed_intervals",
    "push_mix_text",
    "running_fleet",
]

_ENROL_ATTEMPTS = 8


def fleet_cluster(
    workdir: str,
    interval: float,
    verifier_options: dict[str, Any] | None = None,
    verifiers: int = 1,
    database_url: str | None = None,
    push_port: int | None = None,
) -> LocalCluster:
    """A cluster sized for a fleet: no node quota (one project enrols the
    whole fleet), many quotes in flight, and room for slow rounds before
    an unanswered node counts as unreachable; with ``push_port`` its
    verifier also takes pushed evidence there, as often as agents send it."""
    sections: dict[str, dict[str, Any]] = {"quota": {"nodes": -1}}
    if push_port is not None:
        sections["push"] = {"port": push_port, "min_interval": 0.0}
    options: dict[str, Any] = {"max_in_flight": 512, "max_unreachable": 1000}
    options.update(verifier_options or {})
    return LocalCluster(
        os.path.join(workdir, "cluster"),
        nodes=0,
        interval=interval,
        notifiers=("noop",),
        verifier_options=options,
        verifier_sections=sections,
        verifiers=verifiers,
        database_url=database_url,
    )


def keep_service_logs(workdir: str, dest: str) -> None:
    """Copy the services' logs of a run in ``workdir`` (made by
    :func:`fleet_cluster`) to ``dest``, so they outlive its directory."""
    os.makedirs(dest, exist_ok=True)
    cluster_dir = os.path.join(workdir, "cluster")
    for name in os.listdir(cluster_dir) if os.path.isdir(cluster_dir) else ():
        if name.endswith((".log", ".out")):
            shutil.copy(os.path.join(cluster_dir, name), dest)


@contextlib.contextmanager
def running_fleet(
    cluster: LocalCluster,
    n: int,
    workdir: str,
    use_uvloop: bool = True,
    timeout: float = 3600,
    push_url: str | None = None,
    ima: ImaLoad | None = None,
    push_every: int = 1,
    push_own_connections: bool = False,
) -> Iterator[FleetProcess]:
    """Start ``cluster`` and ``n`` emulated agents registered with its
    registrar (pushing their evidence to ``push_url`` when given, every
    ``push_every``-th of them only, each over its own connection with
    ``push_own_connections``, with IMA lists when ``ima`` is given); stop
    both on exit."""
    fleet = FleetProcess(
        n,
        cluster.registrar_url,
        cluster.pki,
        workdir,
        use_uvloop,
        push_url,
        ima,
        push_every,
        push_own_connections,
    )
    try:
        cluster.start()
        fleet.registrar_url = cluster.registrar_url
        fleet.start(timeout)
        yield fleet
    finally:
        fleet.stop()
        cluster.stop()


class FleetApi:
    """The verifier's API as the fleet's tenant (enrol, list) and as the
    operator (counters of every project).

    Args:
        cluster: the started cluster.
        base: one verifier's base URL.
    """

    def __init__(self, cluster: LocalCluster, base: str) -> None:
        def context(name: str) -> Any:
            return tlsutil.client_context(
                cluster.pki_file(f"{name}.pem"),
                cluster.pki_file(f"{name}-key.pem"),
                cluster.pki_file("ca.pem"),
            )

        self.base = base
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=context("tenant"), limit=32)
        )
        self.operator = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=context("operator"), limit=2)
        )

    async def stats(self) -> dict[str, Any]:
        async with self.operator.get(f"{self.base}/v1/stats") as resp:
            if resp.status != 200:
                raise RuntimeError(f"stats: {resp.status} {await resp.text()}")
            return dict(await resp.json())

    async def nodes(self) -> list[dict[str, Any]]:
        async with self.session.get(f"{self.base}/v1/nodes") as resp:
            if resp.status != 200:
                raise RuntimeError(f"nodes: {resp.status} {await resp.text()}")
            return list((await resp.json())["nodes"])

    async def add_runtime_policy(self, document: dict[str, Any]) -> str:
        """Store a runtime (IMA) policy as the fleet's tenant; returns the
        digest enrolments reference it by."""
        url = f"{self.base}/v1/policies/runtime"
        async with self.session.post(url, json={"policy": document}) as resp:
            if resp.status not in (200, 201):
                raise RuntimeError(f"runtime policy: {resp.status} {await resp.text()}")
            return str((await resp.json())["digest"])

    async def enrol(
        self,
        uuids: list[str],
        pcr16: str,
        mode: str = "pull",
        runtime_policy: str | None = None,
        intervals: dict[str, float] | None = None,
        batch: int = 0,
        modes: dict[str, str] | None = None,
    ) -> None:
        """Enrol every node with a PCR 16 policy in ``mode`` (or its own
        from ``modes``), the stored runtime policy ``runtime_policy`` if
        given, and each node's own quote interval from ``intervals`` if
        given: 32 requests at a time, or with ``batch`` in batches of that
        many nodes (``POST /v1/nodes/batch``, 2 at a time)."""
        policy = PcrPolicy.from_dict({"pcrs": {"16": [pcr16]}})

        def body(uuid: str) -> EnrolmentRequest:
            # the emulated agents take any U: the commitment is a placeholder
            return EnrolmentRequest(
                uuid,
                os.urandom(32),
                policy,
                runtime_policy=runtime_policy,
                mode=AttestationMode(modes.get(uuid, mode) if modes else mode),
                u_commitment=bytes(32),
                interval=intervals.get(uuid) if intervals else None,
            )

        if batch:
            chunks = [uuids[i : i + batch] for i in range(0, len(uuids), batch)]
            semaphore = asyncio.Semaphore(2)

            async def some(chunk: list[str]) -> None:
                async with semaphore:
                    await self._enrol_batch([body(u) for u in chunk])

            await asyncio.gather(*(some(c) for c in chunks))
            return
        semaphore = asyncio.Semaphore(32)

        async def one(uuid: str) -> None:
            request = body(uuid).to_dict()
            # a loaded machine may time out the verifier's registrar
            # look-up (502/503/504): the enrolment is retried as a
            # tenant's client would
            for attempt in range(_ENROL_ATTEMPTS):
                async with (
                    semaphore,
                    self.session.post(f"{self.base}/v1/nodes", json=request) as resp,
                ):
                    if resp.status == 201:
                        return
                    text = await resp.text()
                if resp.status not in (502, 503, 504):
                    break
                await asyncio.sleep(min(30.0, 2.0**attempt))
            raise RuntimeError(f"enrol {uuid}: {resp.status} {text}")

        await asyncio.gather(*(one(u) for u in uuids))

    async def _enrol_batch(self, requests: list[EnrolmentRequest]) -> None:
        """One batch enrolment, its refused nodes asked again (a loaded
        machine: 502-504, as :meth:`enrol`)."""
        url = f"{self.base}/v1/nodes/batch"
        for attempt in range(_ENROL_ATTEMPTS):
            body = EnrolmentBatch(tuple(requests)).to_dict()
            async with self.session.post(url, json=body) as resp:
                text = await resp.text()
            if resp.status == 200:
                items = orjson.loads(text)["nodes"]
                failed = {i["uuid"]: i for i in items if i["status"] != 201}
                if not failed:
                    return
                if any(i["status"] not in (502, 503, 504) for i in failed.values()):
                    raise RuntimeError(
                        f"batch enrolment refused: {list(failed.values())[:3]}"
                    )
                requests = [r for r in requests if r.uuid in failed]
            elif resp.status not in (502, 503, 504):
                raise RuntimeError(f"batch enrolment: {resp.status} {text}")
            await asyncio.sleep(min(30.0, 2.0**attempt))
        raise RuntimeError(f"batch enrolment: {len(requests)} nodes still refused")

    async def node(self, uuid: str) -> dict[str, Any]:
        """One node's view."""
        async with self.session.get(f"{self.base}/v1/nodes/{uuid}") as resp:
            if resp.status != 200:
                raise RuntimeError(f"node {uuid}: {resp.status} {await resp.text()}")
            return dict(await resp.json())

    async def events(self, kind: str, since: str) -> list[dict[str, Any]]:
        """Every event of ``kind`` since ``since`` (ISO 8601), every page."""
        found: list[dict[str, Any]] = []
        params = {"kind": kind, "since": since, "limit": "1000"}
        while True:
            url = f"{self.base}/v1/events"
            async with self.operator.get(url, params=params) as resp:
                if resp.status != 200:
                    raise RuntimeError(f"events: {resp.status} {await resp.text()}")
                page = (await resp.json())["events"]
            found.extend(page)
            if len(page) < 1000:
                return found
            params["marker"] = page[-1]["id"]

    async def wait_attested(self, n: int, timeout: float) -> None:
        """Wait until ``n`` nodes are attested."""
        deadline = time.monotonic() + timeout
        while (stats := await self.stats())["states"]["attested"] < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"not all {n} attested in {timeout:g} s: {stats}")
            await asyncio.sleep(0.5)

    async def close(self) -> None:
        await self.session.close()
        await self.operator.close()


FAST = (2.0, 10.0)  # seconds: kept-alive connections (agent_keep_alive 15 s)
SLOW = (60.0, 300.0)  # seconds: disconnected after each round


def mixed_intervals(uuids: Sequence[str], share: float) -> dict[str, float]:
    """Per-node quote intervals: ``share`` of the nodes in the fast class,
    the rest in the slow one, each drawn uniformly in its range (seeded:
    the same mix on every run)."""
    rng = random.Random(len(uuids))
    fast = round(share * len(uuids))
    return {
        uuid: rng.uniform(*(FAST if i < fast else SLOW)) for i, uuid in enumerate(uuids)
    }


def push_mix_text(share: float) -> str:
    """The mix of :func:`mixed_intervals` for push nodes, in words."""
    return (
        f"intervals mixed: {share:.0%} of the push nodes every {FAST[0]:g}-"
        f"{FAST[1]:g} s, {1 - share:.0%} every {SLOW[0]:g}-{SLOW[1]:g} s; each "
        "agent on its own connection, kept while idle up to 30 s as the real "
        "agent's client does (the server's keepalive is 75 s)"
    )


def mix_text(share: float) -> str:
    """The mix of :func:`mixed_intervals` in words."""
    return (
        f"intervals mixed: {share:.0%} of the nodes every {FAST[0]:g}-{FAST[1]:g} s "
        f"(connections kept), {1 - share:.0%} every {SLOW[0]:g}-{SLOW[1]:g} s "
        "(closed after each round)"
    )
