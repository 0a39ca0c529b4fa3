"""Fixtures for the end-to-end tests: one real deployment per test module,
plus in-process agents on a software TPM that misbehave on purpose."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import os
import threading
import uuid as uuid_mod
from collections.abc import Coroutine
from typing import Any

import requests
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from node_agent.agent import Agent, TpmAccess
from node_agent.server import make_app
from trusted_testing.cluster import LocalCluster, free_port
from trusted_testing.softtpm import SoftTpm
from verifier.protocol import Quote


def sign_ek_certificate(tpm: SoftTpm, ca_dir: str) -> bytes:
    """An EK certificate for ``tpm`` from the CA whose key and cert are
    ``signkey.pem`` and ``issuercert.pem`` in ``ca_dir`` (swtpm's layout)."""
    with open(os.path.join(ca_dir, "signkey.pem"), "rb") as f:
        key = serialization.load_pem_private_key(f.read(), None)
    with open(os.path.join(ca_dir, "issuercert.pem"), "rb") as f:
        issuer = x509.load_pem_x509_certificate(f.read())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "soft EK")]))
        .issuer_name(issuer.subject)
        .public_key(tpm.ek_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .sign(key, hashes.SHA256())  # type: ignore[arg-type]
    )
    return cert.public_bytes(serialization.Encoding.DER)


def make_foreign_ca(directory: str) -> str:
    """A CA unrelated to the deployment, in swtpm's file layout."""
    os.makedirs(directory, exist_ok=True)
    key = rsa.generate_private_key(65537, 2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Foreign EK CA")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    with open(os.path.join(directory, "signkey.pem"), "wb") as f:
        f.write(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    with open(os.path.join(directory, "issuercert.pem"), "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    return directory


class EvilTpm:
    """A software TPM that behaves honestly until ``attack`` is set.

    Attacks: ``replay`` (answer with the first quote ever made),
    ``foreign_ak`` (sign with another key), ``clock_rollback`` (report an
    earlier clock), ``lie_pcrs`` (report PCR values other than those signed).
    """

    def __init__(self, ek_cert_ca: str, pcr16: bytes) -> None:
        self.soft = SoftTpm(ak_alg="ecc", ek_alg="rsa")
        self.soft.pcrs[16] = pcr16
        self.soft.clock = 50_000_000
        self.golden = pcr16
        self.ek_cert = sign_ek_certificate(self.soft, ek_cert_ca)
        self.attack: str | None = None
        self.first: Quote | None = None
        self.quotes = 0

    def ek_public(self) -> bytes:
        return self.soft.ek.to_bytes()

    def ek_certificate(self) -> bytes | None:
        return self.ek_cert

    def ak_public(self) -> bytes:
        return self.soft.ak.to_bytes()

    def activate_credential(self, blob: bytes, secret: bytes) -> bytes:
        return self.soft.activate_credential(blob, secret)

    def close(self) -> None:
        pass

    def quote(
        self,
        qualifying_data: bytes,
        pcrs: list[int],
        banks: tuple[str, ...] = ("sha256",),
    ) -> Quote:
        self.quotes += 1
        if self.attack == "foreign_ak":
            return SoftTpm().quote(qualifying_data, tuple(pcrs))
        if self.attack == "clock_rollback":
            self.soft.clock -= 10_000
        golden = {i: self.soft.pcrs[i] for i in pcrs}
        if self.attack == "lie_pcrs" and self.soft.pcrs[16] == self.golden:
            self.soft.extend(16, b"\x01" * 32)  # the node really changed
        quote = self.soft.quote(qualifying_data, tuple(pcrs), banks)
        if self.first is None:
            self.first = quote
        if self.attack == "replay":
            return self.first
        if self.attack == "lie_pcrs":
            return Quote(quote.attest, quote.signature, golden)
        return quote


@dataclasses.dataclass
class InProcessAgent:
    agent: Agent
    tpm: EvilTpm
    port: int
    runner: web.AppRunner | None = None


class AgentThread:
    """An event loop in a thread that runs in-process agents."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.agents: list[InProcessAgent] = []

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start_agent(
        self,
        cluster: LocalCluster,
        tpm: EvilTpm,
        workdir: str,
        register: bool = True,
        activate: bool = True,
    ) -> InProcessAgent:
        port = free_port()
        agent = Agent(
            str(uuid_mod.uuid4()),
            TpmAccess(lambda: tpm, shared=False),
            workdir,
            registrar_url=cluster.registrar_url,
            ca_file=cluster.pki_file("ca.pem"),
            cert_file=cluster.pki_file("agent.pem"),
            key_file=cluster.pki_file("agent-key.pem"),
            port=port,
        )
        handle = InProcessAgent(agent, tpm, port)

        async def _start() -> None:
            runner = web.AppRunner(make_app(agent), access_log=None)
            await runner.setup()
            site = web.TCPSite(
                runner, "127.0.0.1", port, ssl_context=agent.server_ssl_context()
            )
            await site.start()
            handle.runner = runner
            if register and activate:
                await agent.register()

        self.run(_start())
        self.agents.append(handle)
        return handle

    def stop(self) -> None:
        for handle in self.agents:
            if handle.runner is not None:
                self.run(handle.runner.cleanup())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


class Http:
    """A synchronous mTLS client for the REST APIs (requests)."""

    def __init__(self, cluster: LocalCluster, name: str = "tenant") -> None:
        self.session = requests.Session()
        self.session.trust_env = False  # ignore REQUESTS_CA_BUNDLE and proxies
        self.session.cert = (
            cluster.pki_file(f"{name}.pem"),
            cluster.pki_file(f"{name}-key.pem"),
        )
        self.session.verify = cluster.pki_file("ca.pem")

    def call(self, method: str, url: str, **kw: Any) -> requests.Response:
        return self.session.request(method, url, timeout=10, **kw)


__all__ = ["AgentThread", "EvilTpm", "Http", "make_foreign_ca", "sign_ek_certificate"]
