"""Fleet emulator: many node agents in one process, on software TPMs.

Each emulated agent has its own software TPM (ECC P-256 EK and AK), its own
share-transport key (NK), registers and activates through the real
registrar, and answers the real agent API with real TPM 2.0 quotes. All
agents share one listening socket; each agent has its own loopback address
(127.1.0.1, 127.1.0.2, ...) and is told apart by the address a connection
was made to, so the verifier sees N distinct peers with N connections.

Run as a process (the benchmark does)::

    python -m trusted_testing.fleet --n 1000 --port 9400 \
        --registrar https://127.0.0.1:8891 --pki DIR --ready-file F

With ``--push URL`` the agents also push their evidence to the verifier's
push endpoint (:mod:`trusted_testing.fleet_push`), for nodes enrolled in
push mode; with ``--push-every K`` only every K-th agent does (index 0, K,
2K, ...: :func:`pushing`), the others are polled.

With ``--ima K`` every agent keeps an IMA measurement list that grows by K
entries per quote asking for it, extended into PCR 10 and served from the
index the verifier asks for (:mod:`trusted_testing.fleet_ima`).

Latency: ``POST /_fleet/rtt {"rtt": 0.15}`` (:meth:`FleetProcess.set_rtt`)
holds every answer back that many seconds from then on, as if the agents
were that far away; connections are kept alive, so the TLS handshake (not
delayed) happens once per agent.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import functools
import ipaddress
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.parse
import uuid as uuid_mod
from typing import Any

import aiohttp
import orjson
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, x25519
from cryptography.x509.oid import NameOID

from trusted_testing.cluster import die_with_parent
from trusted_testing.fleet_ima import ImaCatalogue, ImaLoad
from trusted_testing.softtpm import SoftTpm
from trusted_testing.swtpm import free_ports
from verifier.common import tls as tlsutil
from verifier.common.http import BlockingClient
from verifier.protocol import (
    EnvelopeError,
    MalformedError,
    ShareKind,
    bind_nonce,
    open_share,
)
from verifier.protocol.messages.errors import ErrorBody
from verifier.protocol.messages.quote import (
    QuoteAnswer,
    QuoteRequest,
    QuoteRequestError,
)
from verifier.protocol.messages.registration import (
    ActivationChallenge,
    ActivationProof,
    RegistrationRequest,
)
from verifier.protocol.messages.shares import ShareAccepted, ShareV

_RAW = serialization.Encoding.Raw, serialization.PublicFormat.Raw
FIRST_ADDRESS = ipaddress.IPv4Address("127.1.0.1")


def _error(code: str, message: str) -> dict[str, Any]:
    """The agents' error body, as the real agent answers."""
    return ErrorBody(code, message).to_dict()


class EmulatedAgent:
    """One node: a software TPM, an NK, counters."""

    __slots__ = (
        "address",
        "ima_count",
        "nk",
        "nk_b64",
        "nk_public",
        "pcr_json",
        "quotes",
        "tpm",
        "uuid",
        "v_received",
    )

    def __init__(self, index: int) -> None:
        self.uuid = str(uuid_mod.uuid4())
        self.address = str(FIRST_ADDRESS + index)
        self.tpm = SoftTpm(ak_alg="ecc", ek_alg="ecc")
        self.nk = x25519.X25519PrivateKey.generate()
        self.nk_public = self.nk.public_key().public_bytes(*_RAW)
        self.nk_b64 = base64.b64encode(self.nk_public).decode()
        #: the last quoted PCR values and their JSON form
        self.pcr_json: tuple[Any, dict[str, str]] = (None, {})
        self.quotes = 0
        self.v_received = False
        self.ima_count = 0  # entries in its IMA list (with --ima)


class Fleet:
    """N emulated agents behind one HTTPS socket.

    Args:
        n: number of agents.
        port: the port every agent listens on (on its own address).
        ca_file: operator CA; clients must present a certificate from it.
        workdir: where the shared TLS key is written.
        ima: the agents' IMA lists (None: no IMA log).
    """

    def __init__(
        self,
        n: int,
        port: int,
        ca_file: str,
        workdir: str,
        ima: ImaLoad | None = None,
    ) -> None:
        self.agents = [EmulatedAgent(i) for i in range(n)]
        self._by_address = {a.address: a for a in self.agents}
        self.port = port
        self.ca_file = ca_file
        self.workdir = workdir
        self.tls_key, self.tls_cert = tlsutil.self_signed_certificate(
            "fleet", ["127.0.0.1"]
        )
        self._csr_cache: bytes | None = None
        #: seconds every answer is held back: an injected round-trip time
        self.rtt = 0.0
        self.ima = ImaCatalogue(ima) if ima is not None else None

    def handle(
        self,
        method: str,
        path: str,
        query: dict[str, str],
        body: bytes,
        local: str,
        peer: str,
    ) -> tuple[int, Any]:
        """Answer one request; returns (status, JSON-able body)."""
        if not _is_loopback(peer):
            return 403, _error("forbidden", "the fleet emulator serves loopback only")
        if path.startswith("/_fleet/"):
            return self._control(method, path, body)
        agent = self._by_address.get(local)
        if agent is None:
            return 404, _error("not_found", "no agent at this address")
        if method == "GET" and path == "/v1/quote":
            try:
                return 200, self._quote(agent, query)
            except QuoteRequestError as exc:
                return 400, _error(exc.code, exc.detail)
        if method == "POST" and path == "/v1/keys/v":
            try:
                share = ShareV.from_dict(json.loads(body))
                open_share(agent.nk, share.v, ShareKind.V, agent.uuid)
            except MalformedError as exc:
                return 400, _error(exc.code, str(exc))
            except EnvelopeError as exc:
                return 400, _error("envelope", str(exc))
            agent.v_received = True
            return 200, ShareAccepted("v", False).to_dict()
        if method == "GET" and path == "/v1/status":
            return 200, {"uuid": agent.uuid, "quotes": agent.quotes}
        return 404, _error("not_found", "not found")

    def _quote(self, agent: EmulatedAgent, query: dict[str, str]) -> dict[str, Any]:
        asked = QuoteRequest.from_query(query)
        csr = self.csr() if asked.csr else None
        bound = (agent.nk_public, csr) if csr is not None else (agent.nk_public,)
        ima = self.ima if asked.ima_from is not None else None
        if ima is not None:  # the node ran more files since the last quote
            agent.ima_count = ima.grow(agent.tpm, agent.ima_count)
        quote = agent.tpm.quote(bind_nonce(asked.nonce, *bound), asked.pcrs)
        agent.quotes += 1
        if csr is not None or asked.ima_from is not None:
            part, error = None, None
            if asked.ima_from is not None:  # read after the quote, as the agent does
                if ima is None:
                    error = "this agent has no IMA log configured"
                else:
                    part = ima.part(asked.ima_from, agent.ima_count)
            return QuoteAnswer(quote, agent.nk_public, csr, part, error).to_dict()
        # QuoteAnswer(quote, nk).to_dict() with the parts that do not change
        # between quotes kept (the test compares the two)
        values = quote.pcr_values
        if agent.pcr_json[0] != values:
            agent.pcr_json = (
                values,
                {str(i): v.hex() for i, v in sorted(values.items())},
            )
        return {
            "quote": {
                "attest": base64.b64encode(quote.attest).decode(),
                "signature": base64.b64encode(quote.signature).decode(),
                "pcrs": agent.pcr_json[1],
            },
            "nk": agent.nk_b64,
        }

    def _control(self, method: str, path: str, body: bytes) -> tuple[int, Any]:
        if method == "GET" and path == "/_fleet/counters":
            return 200, {a.uuid: a.quotes for a in self.agents}
        if method == "POST" and path == "/_fleet/rtt":
            rtt = json.loads(body).get("rtt")
            if isinstance(rtt, bool) or not isinstance(rtt, (int, float)):
                return 400, _error("bad_rtt", "'rtt' must be a number of seconds")
            if not 0 <= rtt <= 10:
                return 400, _error("bad_rtt", "'rtt' must be 0..10 seconds")
            self.rtt = float(rtt)
            return 200, {"rtt": self.rtt}
        if method == "POST" and path == "/_fleet/tamper":
            uuid = json.loads(body)["uuid"]
            for agent in self.agents:
                if agent.uuid == uuid:
                    agent.tpm.extend(16, b"\x66" * 32)
                    return 200, {"tampered": uuid}
            return 404, _error("not_found", "unknown agent")
        return 404, _error("not_found", "not found")

    def csr(self) -> bytes:
        # One CSR for all: the emulator measures the verifier, not the CA.
        if self._csr_cache is None:
            key = ec.generate_private_key(ec.SECP256R1())
            name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fleet")])
            csr = x509.CertificateSigningRequestBuilder().subject_name(name)
            self._csr_cache = csr.sign(key, hashes.SHA256()).public_bytes(
                serialization.Encoding.DER
            )
        return self._csr_cache

    def server_context(self) -> ssl.SSLContext:
        with open(self.ca_file, encoding="utf-8") as f:
            ca_pem = f.read()
        return tlsutil.server_context_from_pem(
            self.tls_cert, self.tls_key, ca_pem, self.workdir
        )

    async def register_all(
        self, registrar_url: str, cert_file: str, key_file: str, concurrency: int = 32
    ) -> None:
        """Register and activate every agent through the real registrar."""
        ctx = tlsutil.client_context(cert_file, key_file, self.ca_file)
        semaphore = asyncio.Semaphore(concurrency)
        connector = aiohttp.TCPConnector(ssl=ctx, limit=concurrency)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def one(agent: EmulatedAgent) -> None:
                async with semaphore:
                    await self._register(session, registrar_url, agent)

            await asyncio.gather(*(one(a) for a in self.agents))

    async def _register(
        self, session: aiohttp.ClientSession, base: str, agent: EmulatedAgent
    ) -> None:
        url = f"{base}/v1/agents/{agent.uuid}"
        body = RegistrationRequest(
            ek_public=agent.tpm.ek,
            ek_certificate=None,
            ak_public=agent.tpm.ak,
            tls_cert=self.tls_cert.decode(),
            host=agent.address,
            port=self.port,
        )
        async with session.post(url, json=body.to_dict()) as resp:
            answer = await resp.json()
            if resp.status != 200:
                raise RuntimeError(f"registration refused: {answer}")
        challenge = ActivationChallenge.from_dict(answer)
        credential = agent.tpm.activate_credential(
            challenge.credential_blob, challenge.encrypted_secret
        )
        proof = ActivationProof(credential)
        async with session.post(url + "/activate", json=proof.to_dict()) as resp:
            if resp.status != 200:
                raise RuntimeError(f"activation refused: {await resp.text()}")


def pushing(index: int, every: int) -> bool:
    """Whether the agent at ``index`` pushes when every ``every``-th does."""
    return index % max(1, every) == 0


class FleetProcess:
    """The emulator as a child process, with its control endpoints.

    Args:
        n: number of agents.
        registrar_url: the real registrar they register with.
        pki: directory with ca.pem, agent.pem/-key.pem and tenant.pem/-key.pem.
        workdir: scratch directory.
        use_uvloop: run the emulator on uvloop.
        push_url: the verifier's push endpoint the agents push to (None:
            they are polled only).
        ima: the agents' IMA lists (None: no IMA log).
        push_every: only every ``push_every``-th agent pushes
            (:func:`pushing`).
        push_own_connections: each pushing agent over its own connection
            (:func:`trusted_testing.fleet_push.push_all`), not a shared pool.
    """

    def __init__(
        self,
        n: int,
        registrar_url: str,
        pki: str,
        workdir: str,
        use_uvloop: bool = True,
        push_url: str | None = None,
        ima: ImaLoad | None = None,
        push_every: int = 1,
        push_own_connections: bool = False,
    ) -> None:
        self.n = n
        self.push_url = push_url
        self.push_every = push_every
        self.push_own_connections = push_own_connections
        self.ima = ima
        self.registrar_url = registrar_url
        self.pki = pki
        self.workdir = workdir
        self.use_uvloop = use_uvloop
        self.port = _free_port()
        self.ready_file = os.path.join(workdir, "fleet-ready.json")
        self.proc: subprocess.Popen[bytes] | None = None
        self.uuids: list[str] = []
        self.pcr16 = ""
        self.register_s = self.register_cpu_s = 0.0

    def start(self, timeout: float = 600) -> None:
        cmd = [
            sys.executable,
            "-m",
            "trusted_testing.fleet",
            "--n",
            str(self.n),
            "--port",
            str(self.port),
            "--registrar",
            self.registrar_url,
            "--pki",
            self.pki,
            "--workdir",
            self.workdir,
            "--ready-file",
            self.ready_file,
        ]
        if self.use_uvloop:
            cmd.append("--uvloop")
        if self.push_url:
            cmd += ["--push", self.push_url, "--push-every", str(self.push_every)]
            if self.push_own_connections:
                cmd.append("--push-own-connections")
        if self.ima is not None:
            cmd += self.ima.to_args()
        with open(os.path.join(self.workdir, "fleet.log"), "wb") as log:
            self.proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent,  # noqa: PLW1509
            )
        deadline = time.monotonic() + timeout
        while not os.path.exists(self.ready_file):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"fleet emulator failed; see {self.workdir}/fleet.log"
                )
            time.sleep(0.1)
        with open(self.ready_file, encoding="utf-8") as f:
            ready = json.load(f)
        self.uuids, self.pcr16 = ready["uuids"], ready["pcr16"]
        self.register_s = float(ready.get("register_s", 0.0))
        self.register_cpu_s = float(ready.get("register_cpu_s", 0.0))

    def _control(self, method: str, path: str, body: Any = None) -> Any:
        ctx = tlsutil.client_context(
            os.path.join(self.pki, "tenant.pem"),
            os.path.join(self.pki, "tenant-key.pem"),
            # the emulator's one self-signed certificate, written at its start
            os.path.join(self.workdir, "tls-cert.pem"),
        )
        answer = BlockingClient(ctx, 10).request(
            method, f"https://127.0.0.1:{self.port}{path}", json=body
        )
        if not answer.ok:
            raise RuntimeError(f"fleet control {path}: HTTP {answer.status}")
        return answer.data

    def counters(self) -> dict[str, int]:
        """Quotes answered per agent UUID."""
        return dict(self._control("GET", "/_fleet/counters"))

    def set_rtt(self, rtt: float) -> None:
        """Hold every answer back ``rtt`` seconds from now on: the round
        trip the verifier sees, as if the agents were that far away."""
        self._control("POST", "/_fleet/rtt", {"rtt": rtt})

    def tamper(self, uuid: str) -> None:
        """Extend PCR 16 of one agent: its next quote fails the policy."""
        self._control("POST", "/_fleet/tamper", {"uuid": uuid})

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _free_port() -> int:
    return free_ports(1)


@functools.lru_cache(maxsize=4096)
def _is_loopback(address: str) -> bool:
    return ipaddress.ip_address(address).is_loopback


def _parse_query(qs: str) -> dict[str, str]:
    """``urllib.parse.parse_qsl`` as a dict (last value wins), without its
    cost when nothing is escaped (the verifier's hex nonce and PCR list)."""
    if "%" in qs or "+" in qs:
        return dict(urllib.parse.parse_qsl(qs))
    query = {}
    for part in qs.split("&"):
        key, _, value = part.partition("=")
        if value:  # parse_qsl drops blank values too
            query[key] = value
    return query


class _HttpProtocol(asyncio.Protocol):
    """A minimal HTTP/1.1 keep-alive server protocol for the emulator.

    A general server costs more CPU per request than the software TPM's
    signature; the emulator shares the machine with the verifier under test,
    so it answers with as little work as it can.
    """

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.local = ""
        self.peer = ""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.local = transport.get_extra_info("sockname")[0]
        self.peer = transport.get_extra_info("peername")[0]

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer + data if self.buffer else data
        while True:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                break
            head = buffer[:end]
            length = 0
            at = head.lower().find(b"\r\ncontent-length:")
            if at >= 0:
                stop = head.find(b"\r\n", at + 2)
                length = int(head[at + 17 : stop if stop >= 0 else end])
            if len(buffer) < end + 4 + length:
                break
            body = buffer[end + 4 : end + 4 + length]
            buffer = buffer[end + 4 + length :]
            line_end = head.find(b"\r\n")
            self._answer(
                (head if line_end < 0 else head[:line_end]).decode("latin-1"), body
            )
        self.buffer = buffer

    def _answer(self, request_line: str, body: bytes) -> None:
        assert self.transport is not None
        try:
            method, target, _ = request_line.split(" ", 2)
            path, _, qs = target.partition("?")
            query = _parse_query(qs)
            status, answer = self.fleet.handle(
                method, path, query, body, self.local, self.peer
            )
        except Exception as exc:  # the emulator must answer, not die
            status, answer = 500, _error("internal", repr(exc))
        payload = orjson.dumps(answer)
        data = (
            b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (status, len(payload), payload)
        )
        rtt = self.fleet.rtt
        if rtt > 0:  # an agent far away: its answer arrives one RTT later
            asyncio.get_running_loop().call_later(rtt, self._write_late, data)
        else:
            self.transport.write(data)

    def _write_late(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)


async def _serve(args: argparse.Namespace) -> None:
    pki = args.pki
    ima = ImaLoad(args.ima, args.ima_paths, args.ima_binary) if args.ima else None
    fleet = Fleet(args.n, args.port, os.path.join(pki, "ca.pem"), args.workdir, ima)
    loop = asyncio.get_running_loop()
    # One socket for all emulated addresses (127.1.x.y); only loopback
    # clients are answered: the verifier under test on this machine.
    server = await loop.create_server(
        lambda: _HttpProtocol(fleet),
        "0.0.0.0",  # noqa: S104
        args.port,
        ssl=fleet.server_context(),
        backlog=4096,
    )
    started, cpu = time.monotonic(), time.process_time()
    await fleet.register_all(
        args.registrar,
        os.path.join(pki, "agent.pem"),
        os.path.join(pki, "agent-key.pem"),
    )
    registration = {  # what the registration storm took on this side
        "register_s": time.monotonic() - started,
        "register_cpu_s": time.process_time() - cpu,
    }
    pcr16 = fleet.agents[0].tpm.pcrs[16].hex() if fleet.agents else ""
    with open(args.ready_file + ".tmp", "w", encoding="utf-8") as f:
        ready = {"uuids": [a.uuid for a in fleet.agents], "pcr16": pcr16}
        json.dump({**ready, **registration}, f)
    os.replace(args.ready_file + ".tmp", args.ready_file)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if args.push:
        from trusted_testing.fleet_push import push_all

        agents = [a for i, a in enumerate(fleet.agents) if pushing(i, args.push_every)]
        await push_all(
            agents,
            fleet.csr,
            args.push,
            os.path.join(pki, "ca.pem"),
            stop,
            own_connections=args.push_own_connections,
        )
    await stop.wait()
    server.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Emulate N node agents.")
    parser.add_argument("--n", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--registrar", required=True)
    parser.add_argument("--pki", required=True, help="dir with ca.pem, agent.pem")
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--ready-file", required=True)
    parser.add_argument("--uvloop", action="store_true")
    parser.add_argument("--push", help="the verifier's push endpoint URL")
    parser.add_argument(
        "--push-every", type=int, default=1, help="only every K-th agent pushes"
    )
    parser.add_argument(
        "--push-own-connections",
        action="store_true",
        help="each pushing agent over a connection of its own (default: one "
        "shared pool of 256)",
    )
    parser.add_argument(
        "--ima", type=int, default=0, help="new IMA entries per quote (0: no IMA)"
    )
    parser.add_argument("--ima-paths", type=int, default=100_000)
    parser.add_argument("--ima-binary", action="store_true")
    args = parser.parse_args(argv)
    if args.uvloop:
        import uvloop

        uvloop.install()
    asyncio.run(_serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
