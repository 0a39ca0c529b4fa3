#!/usr/bin/env python3
"""Verifier-side memory of one kept-alive pinned mTLS connection.

Opens N pinned mutual-TLS connections from this process through the one
HTTP client (:class:`verifier.common.agent_client.AgentClient`, as the
verifier's quote loop does) to N distinct origins of a local TLS server
(a child process: its memory does not count), one request each with an
answer of quote size, and reports the growth of this process's resident
memory per connection: while every connection idles (kept alive), after a
second round over the same connections, and after all are closed (and the
heap trimmed). Also the CPU of one request over a kept connection and of
one with a fresh handshake. Each event loop is measured in a fresh child
process.

``--loops ... curl`` measures libcurl's multi interface (pycurl) the same
way, in its own child (issue 34, item 5): TLS, HTTP/1.1 framing, keep-alive
(the multi handle's connection cache, sized for every agent), the client
certificate and the pin (``CURLOPT_PINNEDPUBLICKEY``: the agent's public
key, where ours pins its whole certificate) all in C, one easy handle per
agent (as ours keeps one pin per agent), at most 64 transfers in flight
(as ours), driven by ``perform``/``select`` in a plain loop: the least
curl can cost, before any asyncio integration.

    .venv/bin/python tools/bench/connmem.py [--n 2000] [--loops uvloop asyncio curl]
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import ctypes.util
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))

from trusted_testing.procstat import cpu_seconds, rss_kib  # noqa: E402
from verifier.attest.memtrim import malloc_trim  # noqa: E402
from verifier.ca import CertificateAuthority  # noqa: E402
from verifier.common import tls as tlsutil  # noqa: E402
from verifier.common.agent_client import AgentClient  # noqa: E402

_ANSWER = 1800  # bytes of a quote answer (ECC P-256 quote, signature, nonce)


class _Server(asyncio.Protocol):
    """Answers every request with one fixed JSON body, kept alive."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            self.buf = self.buf[end + 4 :]
            assert self.transport is not None
            self.transport.write(self.answer)


async def _serve(pki: str, ports: int, ready: str) -> None:
    ctx = tlsutil.server_context(
        os.path.join(pki, "server.pem"),
        os.path.join(pki, "server-key.pem"),
        os.path.join(pki, "ca.pem"),
    )
    body = json.dumps({"quote": "x" * (_ANSWER - 64)}).encode()
    answer = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    loop = asyncio.get_running_loop()
    servers = [
        await loop.create_server(lambda: _Server(answer), "127.0.0.1", 0, ssl=ctx)
        for _ in range(ports)
    ]
    with open(ready + ".tmp", "w") as f:
        json.dump([s.sockets[0].getsockname()[1] for s in servers], f)
    os.replace(ready + ".tmp", ready)
    await asyncio.Event().wait()


async def _client(pki: str, ports: list[int], keep: bool) -> dict[str, float]:
    with open(os.path.join(pki, "server.pem")) as f:
        cert = f.read()
    agents = AgentClient(
        os.path.join(pki, "client.pem"), os.path.join(pki, "client-key.pem"), 30
    )
    # keep idle connections for the whole run: a round of N handshakes on a
    # loaded machine may outlast the client's 30 s idle timeout
    agents._client()._pool._idle_timeout = 3600.0
    bases = [f"https://127.0.0.1:{port}" for port in ports]
    sem = asyncio.Semaphore(64)

    async def one(base: str) -> None:
        async with sem:
            answer = await agents.request("GET", base, cert, "/v1/quote")
            assert answer.ok, answer.status
            if not keep:
                agents.close_idle(base)

    async def round_() -> float:
        t0 = cpu_seconds()
        await asyncio.gather(*(one(b) for b in bases))
        await asyncio.sleep(0.5)  # closes settle
        return cpu_seconds() - t0

    await one(bases[0])  # the client, its context, the code paths warm
    agents.close_idle(bases[0])
    await asyncio.sleep(0.2)
    meter = _Meter()
    cpu_new = await round_()
    meter.mark("idle")
    cpu_again = await round_()
    meter.mark("again", heap=True)
    for base in bases:
        agents.close_idle(base)
    await asyncio.sleep(1)
    meter.mark("closed")
    await agents.close()
    return meter.figures(len(bases), cpu_new, cpu_again)


def _client_curl(pki: str, ports: list[int], keep: bool) -> dict[str, float]:
    """:func:`_client`'s figures for libcurl's multi interface."""
    import base64
    import hashlib

    import pycurl
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    with open(os.path.join(pki, "server.pem"), "rb") as f:
        spki = (
            x509.load_pem_x509_certificate(f.read())
            .public_key()
            .public_bytes(
                serialization.Encoding.DER,
                serialization.PublicFormat.SubjectPublicKeyInfo,
            )
        )
    pin = "sha256//" + base64.b64encode(hashlib.sha256(spki).digest()).decode()
    multi = pycurl.CurlMulti()
    multi.setopt(pycurl.M_MAXCONNECTS, len(ports) + 8)
    received = [0]

    def sink(data: bytes) -> None:
        received[0] += len(data)

    def easy(port: int) -> Any:
        c = pycurl.Curl()
        c.setopt(pycurl.URL, f"https://127.0.0.1:{port}/v1/quote")
        c.setopt(pycurl.SSLCERT, os.path.join(pki, "client.pem"))
        c.setopt(pycurl.SSLKEY, os.path.join(pki, "client-key.pem"))
        c.setopt(pycurl.SSL_VERIFYPEER, 0)  # the pin is the check, as ours
        c.setopt(pycurl.SSL_VERIFYHOST, 0)
        c.setopt(pycurl.PINNEDPUBLICKEY, pin)
        c.setopt(pycurl.FORBID_REUSE, 0 if keep else 1)
        c.setopt(pycurl.TIMEOUT, 30)
        c.setopt(pycurl.WRITEFUNCTION, sink)
        # its smallest buffers (answers are ~2 KB): curl at its leanest
        c.setopt(pycurl.BUFFERSIZE, 4096)
        c.setopt(pycurl.UPLOAD_BUFFERSIZE, 16384)
        return c

    def run(handles: list[Any]) -> None:
        pending, active = list(handles), 0
        while pending or active:
            while pending and active < 64:
                multi.add_handle(pending.pop())
                active += 1
            while multi.perform()[0] == pycurl.E_CALL_MULTI_PERFORM:
                pass
            while True:
                queued, ok, failed = multi.info_read()
                for c in ok:
                    assert c.getinfo(pycurl.RESPONSE_CODE) == 200
                    multi.remove_handle(c)
                    active -= 1
                if failed:
                    raise SystemExit(f"curl: {failed[0][1:]}")
                if not queued:
                    break
            if active:
                multi.select(1.0)

    def round_(handles: list[Any]) -> float:
        before, t0 = received[0], cpu_seconds()
        run(handles)
        spent = cpu_seconds() - t0
        assert received[0] - before >= len(handles) * (_ANSWER - 200)
        return spent

    warm = easy(ports[0])
    warm.setopt(pycurl.FORBID_REUSE, 1)
    run([warm])  # libcurl, its TLS context and the code paths warm
    warm.close()
    meter = _Meter()
    handles = [easy(port) for port in ports]
    cpu_new = round_(handles)
    meter.mark("idle")
    cpu_again = round_(handles)
    meter.mark("again", heap=True)
    multi.close()  # closes the cached connections
    for c in handles:
        c.close()
    meter.mark("closed")
    return meter.figures(len(ports), cpu_new, cpu_again)


class _Meter:
    """This process's resident size (and glibc's heap in use) at each step
    of a client's run, from a trimmed start; :meth:`figures` per connection."""

    def __init__(self) -> None:
        malloc_trim()
        self.rss: dict[str, float] = {}
        self.heap: dict[str, float] = {}
        self.mark("start", heap=True)

    def mark(self, step: str, heap: bool = False) -> None:
        """Read the resident size now (and the heap); after ``again`` and
        ``closed`` also once more after malloc_trim, as the verifier trims
        once a minute."""
        gc.collect()
        self.rss[step] = float(rss_kib())
        if heap:
            info = _mallinfo()  # KiB in use (OpenSSL, the loop's handles)
            self.heap[step] = float(info.uordblks + info.hblkhd) / 1024
        if step in ("again", "closed"):
            malloc_trim()
            self.rss[step + "+trim"] = float(rss_kib())

    def figures(self, n: int, cpu_new: float, cpu_again: float) -> dict[str, float]:
        r, h = self.rss, self.heap

        def per(step: str) -> float:
            return (r[step] - r["start"]) / n

        return {
            "idle_kib": per("idle"),
            "again_kib": per("again"),
            "again_trimmed_kib": per("again+trim"),
            "heap_kib": (h["again"] - h["start"]) / n,
            "closed_kib": per("closed"),
            "trimmed_kib": per("closed+trim"),
            "cpu_first_us": cpu_new / n * 1e6,
            "cpu_second_us": cpu_again / n * 1e6,
        }


class _MallInfo(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks "
            "fordblks keepcost"
        ).split()
    ]


def _mallinfo() -> _MallInfo:
    """glibc's heap counters (zeros elsewhere)."""
    try:
        fn = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return _MallInfo()
    fn.restype = _MallInfo
    return fn()  # type: ignore[no-any-return]


def _child(args: argparse.Namespace) -> None:
    with open(args.ports_file) as f:
        ports = json.load(f)[: args.n]
    if args.loop == "curl":
        print(json.dumps(_client_curl(args.pki, ports, not args.close)))
        return
    coro = _client(args.pki, ports, not args.close)
    if args.loop == "uvloop":
        import uvloop

        result = uvloop.run(coro)
    else:
        result = asyncio.run(coro)
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument(
        "--loops",
        nargs="+",
        choices=("uvloop", "asyncio", "curl"),
        default=["uvloop"],
        help="our client on these event loops, and/or libcurl's multi (curl)",
    )
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--close", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--loop", help=argparse.SUPPRESS)
    parser.add_argument("--pki", help=argparse.SUPPRESS)
    parser.add_argument("--ports-file", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        import uvloop

        uvloop.run(_serve(args.pki, args.n, args.ports_file))
        return
    if args.child:
        _child(args)
        return
    pki = tempfile.mkdtemp(prefix="bench-connmem-")
    ca = CertificateAuthority.create(pki, "bench CA")
    ca.issue_to_files(pki, "server", ["127.0.0.1"])
    ca.issue_to_files(pki, "client", [])
    ports_file = os.path.join(pki, "ports.json")
    me = [sys.executable, os.path.abspath(__file__)]
    common = ["--n", str(args.n), "--pki", pki, "--ports-file", ports_file]
    server = subprocess.Popen([*me, "--serve", *common])
    try:
        while not os.path.exists(ports_file):
            if server.poll() is not None:
                raise SystemExit("the TLS server did not start")
            time.sleep(0.1)
        print(
            f"client memory per pinned mTLS connection, {args.n} connections, "
            f"{_ANSWER}-byte answers; load average {_load()}"
        )
        print(
            f"{'loop':>8} {'mode':>6} {'RSS round 1':>12} {'RSS round 2':>12} "
            f"{'+trim':>8} {'C heap':>8} {'closed':>8} {'+trim':>8} "
            f"{'CPU/req 1':>10} {'CPU/req 2':>10}"
        )
        for loop in args.loops:
            for close in (False, True):
                cmd = [*me, "--child", "--loop", loop, *common]
                if close:
                    cmd.append("--close")
                out = subprocess.run(cmd, check=True, capture_output=True, text=True)
                r: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
                print(
                    f"{loop:>8} {'close' if close else 'keep':>6} "
                    f"{r['idle_kib']:>9.1f}KiB {r['again_kib']:>9.1f}KiB "
                    f"{r['again_trimmed_kib']:>5.1f}KiB {r['heap_kib']:>5.1f}KiB "
                    f"{r['closed_kib']:>5.1f}KiB {r['trimmed_kib']:>5.1f}KiB "
                    f"{r['cpu_first_us']:>8.0f}us {r['cpu_second_us']:>8.0f}us"
                )
        print(
            "per connection; keep: connections kept alive between rounds (round "
            "2 reuses them); close: each closed after its answer (round 2 "
            "handshakes again); +trim: after malloc_trim (the verifier trims "
            "once a minute); C heap: glibc heap in use after round 2; closed: "
            "after every connection is closed"
        )
        print(f"load average at the end {_load()}")
    finally:
        server.terminate()
        server.wait(10)


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    main()
