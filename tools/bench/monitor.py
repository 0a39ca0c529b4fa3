#!/usr/bin/env python3
"""Monitor attestations per second, batched and unbatched, on a real swtpm.

Excalibur (Santos et al., USENIX Security 2012) served 4,800 monitor
attestations/s batched against 0.82/s with one TPM quote each. Here the
verifier host's TPM is a swtpm process; every quote is a real TPM2_Quote
through tpm2-pytss (:class:`verifier.attest.monitor.HostTpm`).

Three measurements, each for ``--seconds``:

* ``unbatched``: ``max_batch = 1``, one quote per request;
* ``batched core``: ``--clients`` coroutines in one process call
  :meth:`MonitorBatcher.attest` back to back (no HTTP: the batching,
  Merkle tree, paths and quotes only);
* ``batched HTTP``: the aiohttp monitor routes served over TLS in a
  child process, and ``--procs`` client processes keeping
  ``--connections`` keep-alive connections busy.

A sample of replies is verified with the customer's check
(:func:`verifier.protocol.monitor.verify_monitor_attestation`) outside the
timed part. Prints rates; nothing is asserted.

    .venv/bin/python tools/bench/monitor.py [--seconds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import multiprocessing
import os
import ssl
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))

from trusted_testing.swtpm import Swtpm, free_port_pair  # noqa: E402
from verifier.attest.monitor import HostTpm, MonitorBatcher  # noqa: E402
from verifier.protocol import AttestationKey, PcrPolicy, TpmPublic  # noqa: E402
from verifier.protocol.monitor import (  # noqa: E402
    MonitorAttestation,
    verify_monitor_attestation,
)

PCR = 16
EXCALIBUR = {"unbatched": 0.82, "batched": 4800.0}


async def _core(
    tcti: str, max_batch: int, clients: int, seconds: float, window: float
) -> tuple[float, float, int]:
    host = HostTpm(tcti, [PCR])
    ak_raw, _, _ = await host.identity()
    ak = AttestationKey(TpmPublic.from_bytes(ak_raw), True)
    batcher = MonitorBatcher(host.quote, window, max_batch)
    batcher.start()
    samples: list[tuple[bytes, MonitorAttestation]] = []
    done = 0
    go = asyncio.Event()
    stop_at = 0.0

    async def client(i: int) -> None:
        nonlocal done
        await go.wait()
        while time.perf_counter() < stop_at:
            nonce = os.urandom(32)
            reply = await batcher.attest(nonce)
            done += 1
            if i == 0:
                samples.append((nonce, reply))

    tasks = [asyncio.create_task(client(i)) for i in range(clients)]
    await asyncio.sleep(0.5)  # every client task created and waiting
    start = time.perf_counter()
    stop_at = start + seconds
    go.set()
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - start
    await batcher.stop()
    host.close()
    quote = samples[0][1].quote
    policy = PcrPolicy.from_dict({"pcrs": {str(PCR): [quote.pcr_values[PCR].hex()]}})
    for nonce, reply in samples[:50]:
        verify_monitor_attestation(reply, nonce=nonce, ak=ak, policy=policy)
    mean_batch = batcher.attested / max(batcher.batches, 1)
    return done / elapsed, mean_batch, batcher.batches


def _serve(tcti: str, port: int, pki: str, window: float, ready: object) -> None:
    import uvloop
    from aiohttp import web

    from verifier.api.monitor_app import add_monitor_routes
    from verifier.common.tls import server_context
    from verifier.common.web import error_middleware

    async def main() -> None:
        host = HostTpm(tcti, [PCR])
        batcher = MonitorBatcher(host.quote, window, 1 << 20)
        batcher.start()
        app = web.Application(middlewares=[error_middleware])
        add_monitor_routes(app, batcher, host)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        ctx = server_context(
            f"{pki}/verifier.pem", f"{pki}/verifier-key.pem", f"{pki}/ca.pem"
        )
        await web.TCPSite(runner, "127.0.0.1", port, ssl_context=ctx).start()
        ready.set()  # type: ignore[attr-defined]
        await asyncio.Event().wait()

    uvloop.run(main())


def _client(
    port: int, pki: str, conns: int, seconds: float, out: object, barrier: object
) -> None:
    import aiohttp
    import uvloop

    from verifier.common.tls import client_context

    async def main() -> int:
        ctx: ssl.SSLContext = client_context(
            f"{pki}/tenant.pem", f"{pki}/tenant-key.pem", f"{pki}/ca.pem"
        )
        base = f"https://127.0.0.1:{port}"
        conn = aiohttp.TCPConnector(ssl=ctx, limit=conns)
        done = 0
        async with aiohttp.ClientSession(connector=conn) as session:
            async with session.get(f"{base}/v1/monitor/ak") as resp:
                info = await resp.json()
            ak_raw = base64.b64decode(info["ak_public"])
            ak = AttestationKey(TpmPublic.from_bytes(ak_raw), True)
            checked: list[tuple[bytes, dict[str, object]]] = []
            stop_at = float("inf")

            async def one() -> None:
                nonlocal done
                while time.perf_counter() < stop_at:
                    nonce = os.urandom(32)
                    url = f"{base}/v1/monitor/attest?nonce={nonce.hex()}"
                    async with session.get(url) as resp:
                        data = await resp.json()
                    if resp.status != 200:
                        raise RuntimeError(f"monitor answered {resp.status}: {data}")
                    done += 1
                    if len(checked) < 20:
                        checked.append((nonce, data))

            # warm up: open and handshake every keep-alive connection
            stop_at = 0.0
            await asyncio.gather(*(one() for _ in range(conns)))
            warm = [session.get(f"{base}/v1/monitor/ak") for _ in range(conns)]
            for resp in await asyncio.gather(*warm):
                await resp.read()
                resp.release()
            await asyncio.to_thread(barrier.wait)  # type: ignore[attr-defined]
            stop_at = time.perf_counter() + seconds
            await asyncio.gather(*(one() for _ in range(conns)))
        for nonce, data in checked:
            reply = MonitorAttestation.from_dict(data)
            value = reply.quote.pcr_values[PCR].hex()
            policy = PcrPolicy.from_dict({"pcrs": {str(PCR): [value]}})
            verify_monitor_attestation(reply, nonce=nonce, ak=ak, policy=policy)
        return done

    out.put(uvloop.run(main()))  # type: ignore[attr-defined]


def _http(
    tcti: str, tmp: str, procs: int, connections: int, seconds: float, window: float
) -> float:
    from trusted_testing.cluster import free_port
    from verifier.ca import CertificateAuthority

    pki = os.path.join(tmp, "pki")
    ca = CertificateAuthority.create(pki, "bench CA")
    for name in ("verifier", "tenant"):
        ca.issue_to_files(pki, name, ["127.0.0.1"])
    port = free_port()
    mp = multiprocessing.get_context("spawn")
    ready = mp.Event()
    server = mp.Process(target=_serve, args=(tcti, port, pki, window, ready))
    server.start()
    try:
        if not ready.wait(60):
            raise RuntimeError("monitor server did not start")
        out = mp.Queue()
        barrier = mp.Barrier(procs)
        clients = [
            mp.Process(
                target=_client, args=(port, pki, connections, seconds, out, barrier)
            )
            for _ in range(procs)
        ]
        for c in clients:
            c.start()
        total = sum(out.get(timeout=seconds + 180) for _ in clients)
        for c in clients:
            c.join()
        return total / seconds
    finally:
        server.terminate()
        server.join()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--clients", type=int, default=5000)
    p.add_argument("--window-ms", type=float, default=5.0)
    p.add_argument("--procs", type=int, default=1, help="HTTP client processes")
    p.add_argument("--connections", type=int, default=256, help="per process")
    args = p.parse_args()
    window = args.window_ms / 1000
    with tempfile.TemporaryDirectory(prefix="bench-monitor-") as tmp:
        tpm = Swtpm(os.path.join(tmp, "tpm"), free_port_pair(), f"{tmp}/ca")
        tpm.start()
        try:
            rows = []
            rate, mean, batches = asyncio.run(
                _core(tpm.tcti, 1, 8, args.seconds, window)
            )
            rows.append(("unbatched (1 quote/request)", rate, mean, batches))
            rate, mean, batches = asyncio.run(
                _core(tpm.tcti, 1 << 20, args.clients, args.seconds, window)
            )
            rows.append((f"batched core, {args.clients} clients", rate, mean, batches))
            http = _http(
                tpm.tcti, tmp, args.procs, args.connections, args.seconds, window
            )
        finally:
            tpm.stop()
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"swtpm TPM2_Quote (ECC P-256 AK), window {args.window_ms} ms; "
        f"{os.cpu_count()} CPUs, load average {load}"
    )
    print(f"{'mode':42} {'attest/s':>10} {'batch':>8} {'quotes':>7}")
    for name, rate, mean, batches in rows:
        print(f"{name:42} {rate:10.1f} {mean:8.1f} {batches:7d}")
    conns = args.procs * args.connections
    print(f"{'batched HTTP+TLS, ' + str(conns) + ' keep-alive conns':42} {http:10.1f}")
    print(
        f"Excalibur: batched {EXCALIBUR['batched']:.0f}/s, "
        f"unbatched {EXCALIBUR['unbatched']}/s"
    )


if __name__ == "__main__":
    main()
