"""The node agent against a real swtpm and the real registrar (mTLS)."""

import asyncio
import base64
import os
import ssl
import subprocess
import tempfile
import uuid as uuid_mod

import aiohttp
from aiohttp import web

import verifier.db
import verifier.registrar
from node_agent.agent import Agent, TpmAccess
from node_agent.server import make_app
from trusted_testing.swtpm_case import SwtpmTestCase
from verifier.ca import CertificateAuthority
from verifier.common.tls import pinned_client_context, server_context
from verifier.common.tpm import Tpm
from verifier.protocol import (
    AttestationKey,
    PcrPolicy,
    Quote,
    TpmPublic,
    bind_nonce,
    verify_quote,
)


def _write(path, data, mode=0o600):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


class TestAgentOnSwtpm(SwtpmTestCase):
    prefix = "test-agent-swtpm-"

    def setUp(self):
        super().setUp()
        self.dir = tempfile.mkdtemp(dir=self.tmp)
        ca = CertificateAuthority.create(os.path.join(self.dir, "ca"), "test CA")
        self.ca_file = _write(os.path.join(self.dir, "ca.pem"), ca.cert_pem)
        self.files = {}
        for name in ("registrar", "agent", "verifier"):
            key, cert = ca.issue(name, ["127.0.0.1"])
            self.files[name] = (
                _write(os.path.join(self.dir, f"{name}.pem"), cert),
                _write(os.path.join(self.dir, f"{name}-key.pem"), key),
            )
        other = CertificateAuthority.create(os.path.join(self.dir, "other"), "evil")
        key, cert = other.issue("intruder", ["127.0.0.1"])
        self.files["intruder"] = (
            _write(os.path.join(self.dir, "intruder.pem"), cert),
            _write(os.path.join(self.dir, "intruder-key.pem"), key),
        )
        engine = verifier.db.make_engine(
            f"sqlite:///{os.path.join(self.dir, 'r.sqlite')}"
        )
        verifier.db.upgrade(engine)
        self.addCleanup(engine.dispose)
        self.registrar = verifier.registrar.Registrar(engine)

    async def _serve(self, app, ssl_context, cleanups):
        runner = web.AppRunner(app)
        await runner.setup()
        cleanups.append(runner.cleanup)
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
        await site.start()
        return int(runner.addresses[0][1])

    def _tpm_users_can_share(self):
        """With tpm_shared the agent does not hold swtpm's only connection."""
        result = subprocess.run(
            ["tpm2_getrandom", "--hex", "8", "-T", self.swtpm.tcti],
            capture_output=True,
            timeout=30,
            check=False,
        )
        return result.returncode == 0

    async def _body(self):
        cleanups = []
        try:
            cert, key = self.files["registrar"]
            reg_port = await self._serve(
                verifier.registrar.make_app(self.registrar),
                server_context(cert, key, self.ca_file),
                cleanups,
            )
            node = str(uuid_mod.uuid4())
            agent_cert, agent_key = self.files["agent"]
            tcti = self.swtpm.tcti
            agent = Agent(
                node,
                TpmAccess(lambda: Tpm(tcti, "rsa", "ecc"), shared=True),
                os.path.join(self.dir, "work"),
                registrar_url=f"https://127.0.0.1:{reg_port}",
                ca_file=self.ca_file,
                cert_file=agent_cert,
                key_file=agent_key,
                contact_host="127.0.0.1",
            )
            cleanups.append(agent.close)
            agent_port = await self._serve(
                make_app(agent), agent.server_ssl_context(), cleanups
            )
            key_path = os.path.join(self.dir, "work", "tls-key.pem")
            self.assertEqual(0o600, os.stat(key_path).st_mode & 0o777)
            agent.port = agent_port

            await agent.register()
            record = self.registrar.get(node)
            self.assertTrue(record.activated)
            self.assertEqual(agent_port, record.port)
            self.assertEqual(agent.tls_cert_pem.decode(), record.tls_cert)
            self.assertTrue(await asyncio.to_thread(self._tpm_users_can_share))

            # A verifier fetches a quote, pinning the registered TLS cert.
            v_cert, v_key = self.files["verifier"]
            ctx = pinned_client_context(v_cert, v_key, record.tls_cert)
            nonce = os.urandom(20)
            url = f"https://127.0.0.1:{record.port}/v1/quote"
            params = {"nonce": nonce.hex(), "pcrs": "16,23", "csr": "1"}
            async with aiohttp.ClientSession() as session:
                async with session.get(url, params=params, ssl=ctx) as resp:
                    self.assertEqual(200, resp.status)
                    body = await resp.json()
            nk = base64.b64decode(body["nk"])
            csr = base64.b64decode(body["csr"])
            quote = Quote.from_dict(body["quote"])
            ak = AttestationKey(
                TpmPublic.from_bytes(record.ak_public), record.activated
            )
            policy = PcrPolicy({16: frozenset({quote.pcr_values[16]})})
            verdict = verify_quote(
                quote,
                ak=ak,
                qualifying_data=bind_nonce(nonce, nk, csr),
                policy=policy,
            )
            self.assertTrue(verdict)
            self.assertEqual(agent.nk_public, nk)

            # A client with a certificate from another CA is refused.
            bad_cert, bad_key = self.files["intruder"]
            bad_ctx = pinned_client_context(bad_cert, bad_key, record.tls_cert)
            self.assertFalse(await self._get_ok(url, params, bad_ctx))
            # ... and so is a client without any certificate.
            no_cert = ssl.create_default_context(cadata=record.tls_cert)
            no_cert.check_hostname = False
            self.assertFalse(await self._get_ok(url, params, no_cert))
            # The legitimate client still gets through afterwards.
            self.assertTrue(await self._get_ok(url, params, ctx))
        finally:
            for cleanup in reversed(cleanups):
                await cleanup()

    async def _get_ok(self, url, params, ctx):
        """Whether a GET with this TLS context gets an HTTP 200."""
        try:
            async with aiohttp.ClientSession() as session:
                async with session.get(url, params=params, ssl=ctx) as resp:
                    await resp.read()
                    return resp.status == 200
        except (aiohttp.ClientError, ssl.SSLError, ConnectionError):
            return False

    def test_register_activate_quote_over_mtls(self):
        asyncio.run(self._body())
