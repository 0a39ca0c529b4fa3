#!/usr/bin/env python3
"""Server-side cost of a push connection: the lean server against aiohttp.

The verifier's push port is served by :mod:`verifier.common.lean_server`
(issue 34, item 2); it was an aiohttp application. For each server, a
child process serves one push-sized route over TLS on uvloop (as the
verifier does: the verifier's server context, a request body and an
answer of evidence size); this process opens N TLS connections to it, one
request each, and keeps them open. Printed per server: the child's
resident memory per kept connection (idle, after one request), and its CPU
per request over two more rounds on the kept connections (TLS, framing,
dispatch and JSON; no judging). The ratio lean/aiohttp is printed for both.

    .venv/bin/python tools/bench/push_connmem.py [--n 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))

from trusted_testing.https_server import Pki  # noqa: E402
from trusted_testing.procstat import cpu_seconds, rss_kib  # noqa: E402

_BODY = json.dumps({"challenge": "c" * 43, "evidence": {"quote": "q" * 2400}})
_ANSWER = {"state": "attested", "next": {"id": "n" * 43, "nonce": "ab" * 20}}
_KEEP = 600.0


def _serve(kind: str, pki: str) -> None:
    """The child: serve until stdin closes; print the port."""
    import uvloop

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(
        os.path.join(pki, "server.pem"), os.path.join(pki, "server-key.pem")
    )

    async def main() -> None:
        if kind == "lean":
            from verifier.common import lean_server
            from verifier.common.web import parse_json_body

            app = lean_server.LeanApp("bench", 1 << 20)

            def evidence(request: Any, params: Any) -> tuple[int, Any]:
                parse_json_body(request.body)
                return 200, _ANSWER

            app.add("POST", "/v1/push/{uuid}/evidence", evidence)
            server = await lean_server.serve(
                app, "127.0.0.1", 0, context, keepalive=_KEEP
            )
            port = server.sockets[0].getsockname()[1]
        else:
            from aiohttp import web

            from verifier.common import web_runner
            from verifier.common.web import error_middleware, json_response, read_json

            async def handler(request: web.Request) -> web.Response:
                await read_json(request)
                return json_response(_ANSWER)

            aio = web.Application(middlewares=[error_middleware])
            aio.router.add_post("/v1/push/{uuid}/evidence", handler)
            runner = web_runner.AppRunner(aio, keepalive_timeout=_KEEP)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        print(port, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

    uvloop.run(main())


async def _clients(port: int, n: int, ca: str, child: int) -> dict[str, float]:
    context = ssl.create_default_context(cafile=ca)
    request = (
        b"POST /v1/push/n/evidence HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
        % (len(_BODY), _BODY.encode())
    )

    async def exchange(reader: asyncio.StreamReader, writer: Any) -> None:
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        await reader.readexactly(length)

    await asyncio.sleep(0.5)
    rss0 = rss_kib(child)
    conns = []
    for start in range(0, n, 100):  # a hundred handshakes at a time
        batch = await asyncio.gather(
            *[
                asyncio.open_connection("127.0.0.1", port, ssl=context)
                for _ in range(start, min(n, start + 100))
            ]
        )
        await asyncio.gather(*[exchange(r, w) for r, w in batch])
        conns.extend(batch)
    await asyncio.sleep(1.0)
    rss1 = rss_kib(child)
    cpu0, t0 = cpu_seconds(child), time.monotonic()
    for _ in range(2):
        await asyncio.gather(*[exchange(r, w) for r, w in conns])
    cpu1 = cpu_seconds(child)
    wall = time.monotonic() - t0
    for _, writer in conns:
        writer.close()
    return {
        "kib_per_conn": (rss1 - rss0) / n,
        "us_per_request": (cpu1 - cpu0) / (2 * n) * 1e6,
        "requests_per_s": 2 * n / wall,
    }


def _measure(kind: str, n: int, pki: Pki) -> dict[str, float]:
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve", kind, "--pki", pki.dir],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        return asyncio.run(_clients(port, n, pki.ca_file, child.pid))
    finally:
        if child.stdin is not None:
            child.stdin.close()
        child.wait(30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--pki", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        _serve(args.serve, args.pki)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        pki = Pki(tmp)
        load = os.getloadavg()
        print(
            f"push port, {args.n} kept TLS connections, uvloop; "
            f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
        )
        print(f"{'server':>8} {'KiB/conn':>9} {'us/request':>11} {'requests/s':>11}")
        figures = {}
        for kind in ("aiohttp", "lean"):
            f = figures[kind] = _measure(kind, args.n, pki)
            print(
                f"{kind:>8} {f['kib_per_conn']:>9.1f} {f['us_per_request']:>11.0f} "
                f"{f['requests_per_s']:>11.0f}"
            )
        a, b = figures["aiohttp"], figures["lean"]
        print(
            f"lean/aiohttp: memory per connection "
            f"{b['kib_per_conn'] / max(a['kib_per_conn'], 0.001):.2f}, "
            f"CPU per request {b['us_per_request'] / a['us_per_request']:.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
