"""An emulated fleet speaking keylime's pull-mode agent API (v2.x).

N agents in one process, each on its own software TPM
(trusted_testing/softtpm.py: ECC P-256 EK and AK, real TPMS_ATTEST and
TPMT_SIGNATURE), each with its own RSA-2048 "NK" (keylime's agent public key,
which the verifier encrypts V to) and its own HTTPS port on 127.0.0.1. As a
real keylime agent does, each agent extends sha256(its public key PEM) into
PCR 16 at start, and PCR 15 with a fixed "boot" measurement that the
benchmark puts in keylime's TPM policy.

Endpoints (what keylime 7.14.3's verifier calls in pull mode):

* ``GET /v{api}/quotes/integrity?nonce=&mask=&partial=&ima_ml_entry=`` ->
  ``{"code": 200, "status": "Success", "results": {"quote":
  "r<b64 TPMS_ATTEST>:<b64 TPMT_SIGNATURE>:<b64 pcr blob>", "hash_alg":
  "sha256", "enc_alg": "ecc", "sign_alg": "ecdsa", "pubkey": PEM or None,
  "boottime": ...}}``. The quote covers the PCRs of ``mask`` plus PCR 16
  (the rust agent always adds it), the nonce is the TPM's qualifying data,
  and the pcr blob is tpm2-tools' in-memory ``tpml_pcr_selection`` +
  ``tpml_digest[]`` layout that keylime's ``tpm_util.checkquote`` parses.
* ``POST /v{api}/keys/vkey`` (V, encrypted to the NK) -> 200.
* ``GET /version``.

Registration follows keylime's registrar protocol: ``POST
/v2.x/agents/{uuid}`` with ``ek_tpm``, ``aik_tpm``, ``mtls_cert``, ``ip``,
``port``; the answer's ``blob`` is tpm2-tools' MakeCredential output
(``0xBADCC0DE``, version, TPM2B_ID_OBJECT, TPM2B_ENCRYPTED_SECRET), opened
with the soft TPM's ActivateCredential; ``POST .../activate`` with
``auth_tag = HMAC-SHA384(key=b64(credential), agent_id)``.

With ``--ima K`` (issue 19, "IMA under load") every agent keeps an ima-ng
measurement list (trusted_testing/fleet_ima.py, the same lists our emulator
serves) that grows by K entries per quote whose ``mask`` selects PCR 10
(keylime's verifier asks for it when the agent has a runtime policy): they
are extended into PCR 10 before the quote, and the answer carries, as the
rust agent's does, ``ima_measurement_list`` (the ascii list from entry
``ima_ml_entry`` on; from 0 when that is past the end) and
``ima_measurement_list_entry`` (where it starts).

A plain-HTTP control port on 127.0.0.1 answers ``GET /stats`` with the
counters. Everything listens on 127.0.0.1 only.

Run with this repository's virtualenv (it does not import keylime)::

    python tools/bench/keylime/fleet.py --n 100 --registrar http://127.0.0.1:P \
        --ca CV_CA/cacert.crt --workdir DIR --ready-file F
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import hmac
import json
import os
import signal
import socket
import ssl
import struct
import sys
import time
import uuid as uuid_mod
from typing import Any

sys.path.insert(
    0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
)

import aiohttp  # noqa: E402
from aiohttp import web  # noqa: E402
from cryptography.hazmat.primitives import serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import rsa  # noqa: E402

from trusted_testing.fleet_ima import ImaCatalogue, ImaLoad  # noqa: E402
from trusted_testing.softtpm import SoftTpm  # noqa: E402
from verifier.common import tls as tlsutil  # noqa: E402

API_VERSION = "2.2"  # what rust-keylime agents speak; the verifier uses it
TPM_ALG_SHA256 = 0x000B
BOOT_MEASUREMENT = hashlib.sha256(b"emulated boot chain").digest()
POLICY_PCR = 15
DATA_PCR = 16
IMA_PCR = 10


def pcr_blob(values: dict[int, bytes]) -> bytes:
    """tpm2-tools' raw (little-endian, unmarshalled) PCR dump for sha256."""
    select = 0
    for index in values:
        select |= 1 << index
    out = [struct.pack("<I", 1)]  # TPML_PCR_SELECTION.count
    for slot in range(16):  # TPMS_PCR_SELECTION pcrSelections[16]
        if slot == 0:
            out.append(
                struct.pack("<HB", TPM_ALG_SHA256, 3) + select.to_bytes(3, "little")
            )
        else:
            out.append(bytes(6))
        out.append(bytes(2))  # alignment
    digests = [values[i] for i in sorted(values)]
    groups = [digests[i : i + 8] for i in range(0, len(digests), 8)]
    out.append(struct.pack("<I", len(groups)))
    for group in groups:  # TPML_DIGEST: count, TPM2B_DIGEST digests[8]
        out.append(struct.pack("<I", len(group)))
        for k in range(8):
            d = group[k] if k < len(group) else b""
            out.append(struct.pack("<H", len(d)) + d.ljust(64, b"\0"))
    return b"".join(out)


class KeylimeAgent:
    __slots__ = ("ima_count", "port", "pubkey_pem", "quotes", "tpm", "uuid", "vkeys")

    def __init__(self, port: int) -> None:
        self.uuid = str(uuid_mod.uuid4())
        self.port = port
        self.tpm = SoftTpm(ak_alg="ecc", ek_alg="ecc")
        key = rsa.generate_private_key(65537, 2048)
        self.pubkey_pem = (
            key.public_key()
            .public_bytes(
                serialization.Encoding.PEM,
                serialization.PublicFormat.SubjectPublicKeyInfo,
            )
            .decode()
        )
        # What keylime's agent does at start: bind its key to PCR 16.
        self.tpm.extend(DATA_PCR, hashlib.sha256(self.pubkey_pem.encode()).digest())
        self.tpm.extend(POLICY_PCR, BOOT_MEASUREMENT)
        self.quotes = 0
        self.vkeys = 0
        self.ima_count = 0  # entries in its IMA list (with --ima)


def _ok(results: dict[str, Any]) -> web.Response:
    return web.json_response({"code": 200, "status": "Success", "results": results})


class KeylimeFleet:
    def __init__(
        self,
        ports: list[int],
        ca_file: str,
        workdir: str,
        ima: ImaLoad | None = None,
    ) -> None:
        self.agents = [KeylimeAgent(p) for p in ports]
        # the rust agent sends the whole list from the entry asked for
        self.ima = ImaCatalogue(ima, 1 << 40) if ima is not None else None
        self._by_port = {a.port: a for a in self.agents}
        self.ca_file = ca_file
        self.workdir = workdir
        self.tls_key, self.tls_cert = tlsutil.self_signed_certificate(
            "keylime-agent", ["127.0.0.1"]
        )
        self.errors = 0
        self.boottime = int(time.time()) - 1000

    def _agent(self, request: web.Request) -> KeylimeAgent:
        transport = request.transport
        sockname = transport.get_extra_info("sockname") if transport else None
        agent = self._by_port.get(sockname[1]) if sockname else None
        if agent is None:
            raise web.HTTPNotFound(text="no agent at this port")
        return agent

    async def _quote(self, request: web.Request) -> web.Response:
        agent = self._agent(request)
        q = request.query
        nonce = q["nonce"]
        mask = int(q.get("mask") or "0", 0)
        pcrs = tuple(sorted({i for i in range(24) if mask >> i & 1} | {DATA_PCR}))
        ima = self.ima if IMA_PCR in pcrs else None
        if ima is not None:  # the node ran more files since the last quote
            agent.ima_count = ima.grow(agent.tpm, agent.ima_count)
        quote = agent.tpm.quote(nonce.encode(), pcrs)
        blob = pcr_blob(dict(quote.pcr_values))
        b64 = base64.b64encode
        agent.quotes += 1
        extra: dict[str, Any] = {}
        if ima is not None:  # read after the quote, as the agent does
            part = ima.part(int(q.get("ima_ml_entry") or "0"), agent.ima_count)
            extra = {
                "ima_measurement_list": part.entries,
                "ima_measurement_list_entry": part.first,
            }
        return _ok(
            {
                **extra,
                "quote": "r"
                + b64(quote.attest).decode()
                + ":"
                + b64(quote.signature).decode()
                + ":"
                + b64(blob).decode(),
                "hash_alg": "sha256",
                "enc_alg": "ecc",
                "sign_alg": "ecdsa",
                "pubkey": agent.pubkey_pem if q.get("partial") == "0" else None,
                "boottime": self.boottime,
            }
        )

    async def _vkey(self, request: web.Request) -> web.Response:
        agent = self._agent(request)
        body = await request.json()
        if not body.get("encrypted_key"):
            return web.json_response(
                {"code": 400, "status": "no key", "results": {}}, status=400
            )
        agent.vkeys += 1
        return _ok({})

    async def _version(self, request: web.Request) -> web.Response:
        return _ok(
            {"supported_version": API_VERSION, "supported_versions": [API_VERSION]}
        )

    async def _stats(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "quotes": sum(a.quotes for a in self.agents),
                "vkeys": sum(1 for a in self.agents if a.vkeys),
                "agents": len(self.agents),
            }
        )

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get(r"/v{api:[0-9.]+}/quotes/integrity", self._quote)
        app.router.add_post(r"/v{api:[0-9.]+}/keys/vkey", self._vkey)
        app.router.add_get("/version", self._version)
        return app

    def server_context(self) -> ssl.SSLContext:
        # keylime's verifier presents a client certificate from its CA.
        with open(self.ca_file, encoding="utf-8") as f:
            ca_pem = f.read()
        return tlsutil.server_context_from_pem(
            self.tls_cert, self.tls_key, ca_pem, self.workdir
        )

    async def register_all(self, registrar: str, concurrency: int = 8) -> None:
        semaphore = asyncio.Semaphore(concurrency)
        async with aiohttp.ClientSession() as session:

            async def one(agent: KeylimeAgent) -> None:
                async with semaphore:
                    await self._register(session, registrar, agent)

            await asyncio.gather(*(one(a) for a in self.agents))

    async def _register(
        self, session: aiohttp.ClientSession, base: str, agent: KeylimeAgent
    ) -> None:
        url = f"{base}/v{API_VERSION}/agents/{agent.uuid}"
        body = {
            "ek_tpm": base64.b64encode(agent.tpm.ek.to_bytes()).decode(),
            "ekcert": None,
            "aik_tpm": base64.b64encode(agent.tpm.ak.to_bytes()).decode(),
            "mtls_cert": self.tls_cert.decode(),
            "ip": "127.0.0.1",
            "port": agent.port,
        }
        async with session.post(url, json=body) as resp:
            answer = await resp.json(content_type=None)
            if resp.status != 200:
                raise RuntimeError(f"registration refused: {answer}")
        blob = base64.b64decode(answer["results"]["blob"])
        magic, _version = struct.unpack_from(">II", blob, 0)
        if magic != 0xBADCC0DE:
            raise RuntimeError("unexpected credential blob")
        (id_len,) = struct.unpack_from(">H", blob, 8)
        id_object = blob[8 : 10 + id_len]
        secret = blob[10 + id_len :]
        credential = agent.tpm.activate_credential(id_object, secret)
        key = base64.b64encode(credential)
        tag = hmac.new(key, agent.uuid.encode(), hashlib.sha384).hexdigest()
        async with session.post(url + "/activate", json={"auth_tag": tag}) as resp:
            if resp.status != 200:
                raise RuntimeError(f"activation refused: {await resp.text()}")


def listening_sockets(n: int) -> list[socket.socket]:
    """``n`` sockets bound to free ports of 127.0.0.1 and kept: a port
    picked, closed and bound again later can be taken meanwhile by another
    process of a busy machine (EADDRINUSE)."""
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(256)  # a port bound but not listening can be bound again
        socks.append(s)
    return socks


async def _serve(args: argparse.Namespace) -> None:
    socks = listening_sockets(args.n + 1)
    ports = [s.getsockname()[1] for s in socks]
    ima = ImaLoad(args.ima, args.ima_paths) if args.ima else None
    fleet = KeylimeFleet(ports[:-1], args.ca, args.workdir, ima)
    runner = web.AppRunner(fleet.app(), access_log=None)
    await runner.setup()
    ctx = fleet.server_context()
    for sock in socks[:-1]:
        await web.SockSite(runner, sock, ssl_context=ctx, backlog=256).start()
    control = web.Application()
    control.router.add_get("/stats", fleet._stats)
    control_runner = web.AppRunner(control, access_log=None)
    await control_runner.setup()
    control_port = ports[-1]
    await web.SockSite(control_runner, socks[-1]).start()
    await fleet.register_all(args.registrar)
    ready = {
        "control": f"http://127.0.0.1:{control_port}",
        "mtls_cert": fleet.tls_cert.decode(),
        "policy_pcr": POLICY_PCR,
        "policy_value": fleet.agents[0].tpm.pcrs[POLICY_PCR].hex()
        if fleet.agents
        else "",
        "agents": [
            {
                "uuid": a.uuid,
                "port": a.port,
                "ak_tpm": base64.b64encode(a.tpm.ak.to_bytes()).decode(),
            }
            for a in fleet.agents
        ],
    }
    with open(args.ready_file + ".tmp", "w", encoding="utf-8") as f:
        json.dump(ready, f)
    os.replace(args.ready_file + ".tmp", args.ready_file)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()
    await control_runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Emulate N keylime agents.")
    parser.add_argument("--n", type=int, required=True)
    parser.add_argument("--registrar", required=True, help="http://127.0.0.1:PORT")
    parser.add_argument(
        "--ca", required=True, help="keylime verifier's CA (cacert.crt)"
    )
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--ready-file", required=True)
    parser.add_argument(
        "--ima", type=int, default=0, help="new IMA entries per quote (0: none)"
    )
    parser.add_argument("--ima-paths", type=int, default=100_000)
    args = parser.parse_args(argv)
    asyncio.run(_serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
