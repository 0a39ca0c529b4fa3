"""A client certificate the server refuses, as the client tools see it
(issue 33: an expired one showed as ``Connection reset by peer``).

With TLS 1.3 the client's handshake is over before the server judges the
client's certificate: the refusal reaches the client as the connection
closing on its first read. A server with the services' TLS context
(:func:`verifier.common.tls.server_context`, TLS 1.3 only, on uvloop as
the services run) on a loopback port; ``trusted-tenant`` and the agent's
registration, with an expired certificate and with one of another CA, say
in one line that the server refused our certificate, and that it has
expired when it has; the server logs the refusal once, with why.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import threading
import uuid as uuid_mod

import fixtures
import uvloop
from aiohttp import web

from node_agent.exceptions import RegistrationError
from node_agent.registration import Contact, register
from node_agent.tests.unit.test_agent import SoftTpmAdapter
from nova_plugin.tests.unit.test_tenant_cli import run_tenant
from verifier.common import tls as tlsutil
from verifier.common.tpm_access import TpmAccess
from verifier.tests.unit.test_tls_watch import CertDirCase, _ca


class _Service(threading.Thread):
    """An aiohttp application on uvloop with a service's TLS context."""

    def __init__(self, ctx: object) -> None:
        super().__init__(daemon=True)
        self.ctx = ctx
        self.ready = threading.Event()
        self.port = 0

    def run(self) -> None:
        uvloop.run(self._serve())

    async def _serve(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", lambda r: web.json_response({}))
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=self.ctx)
        await site.start()
        self.port = int(runner.addresses[0][1])
        self.loop = asyncio.get_running_loop()
        self.stopped = asyncio.Event()
        self.ready.set()
        await self.stopped.wait()
        await runner.cleanup()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.stopped.set)
        self.join(timeout=30)


class RefusedClientCertificateTest(CertDirCase):
    def setUp(self) -> None:
        super().setUp()
        key, cert = self._cert("server", datetime.timedelta(days=365))
        self.service = _Service(tlsutil.server_context(cert, key, self.ca_file))
        self.logs = fixtures.FakeLogger(name="verifier.common.tls", level=logging.INFO)
        self.logs.setUp()
        self.addCleanup(self.logs.cleanUp)
        self.service.start()
        self.service.ready.wait(timeout=60)
        self.addCleanup(self.service.stop)
        self.url = f"https://127.0.0.1:{self.service.port}"

    def tenant(self, key_file: str, cert_file: str) -> tuple[int, str]:
        return run_tenant(
            [
                f"--verifier={self.url}",
                f"--registrar={self.url}",
                f"--cert={cert_file}",
                f"--key={key_file}",
                f"--ca={self.ca_file}",
                "status",
                str(uuid_mod.uuid4()),
            ]
        )

    def refusals(self) -> list[str]:
        return [
            line
            for line in self.logs.output.splitlines()
            if "Refused a client certificate" in line
        ]

    def test_tenant_with_an_expired_certificate_is_told_it_expired(self) -> None:
        key_file, cert_file = self._cert("tenant", datetime.timedelta(seconds=-60))
        code, err = self.tenant(key_file, cert_file)
        self.assertEqual(1, code, err)
        self.assertEqual(1, len(err.strip().splitlines()), err)
        self.assertIn(f"the server refused our client certificate {cert_file}", err)
        self.assertIn("it expired on", err)
        self.assertNotIn("Traceback", err)
        (line,) = self.refusals()
        self.assertIn("certificate has expired", line)

    def test_tenant_with_a_certificate_of_another_ca_is_told_it_may_be_refused(
        self,
    ) -> None:
        other_key, _ = _ca("test CA")  # same name, another key
        key_file, cert_file = self._cert(
            "intruder", datetime.timedelta(days=1), other_key
        )
        code, err = self.tenant(key_file, cert_file)
        self.assertEqual(1, code, err)
        self.assertEqual(1, len(err.strip().splitlines()), err)
        self.assertIn(
            f"the server may have refused our client certificate {cert_file}", err
        )
        self.assertNotIn("expired", err)
        self.assertEqual(1, len(self.refusals()), self.logs.output)

    def test_agent_registration_with_an_expired_certificate_says_so(self) -> None:
        key_file, cert_file = self._cert("agent", datetime.timedelta(seconds=-60))
        tls_key, tls_cert = tlsutil.self_signed_certificate("agent", ["127.0.0.1"])
        contact = Contact(
            uuid=str(uuid_mod.uuid4()),
            registrar_url=self.url,
            ca_file=self.ca_file,
            cert_file=cert_file,
            key_file=key_file,
            tls_cert_pem=tls_cert,
            host="127.0.0.1",
            port=9002,
        )
        tpm = TpmAccess(SoftTpmAdapter, shared=False)
        with self.assertRaises(RegistrationError) as caught:
            asyncio.run(register(contact, tpm))
        message = str(caught.exception)
        self.assertTrue(caught.exception.retryable)
        self.assertIn(f"the server refused our client certificate {cert_file}", message)
        self.assertIn("it expired on", message)
