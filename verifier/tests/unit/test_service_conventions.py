"""OpenStack service conventions: a request id on every response of every
service (and in the log records of the request), ``/healthcheck`` on each
HTTP service, ``--version`` on every console script."""

from __future__ import annotations

import configparser
import logging
import os
import re
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable

import fixtures
import testtools
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from cryptography.hazmat.primitives.asymmetric import ed25519

from ipsec_puppet_vault_hooks.listener import make_app as listener_app
from node_agent.agent import Agent, TpmAccess
from node_agent.server import make_app as agent_app
from node_agent.tests.unit.test_agent import SoftTpmAdapter
from verifier.common.conventions import REQUEST_ID_HEADER, install_log_request_ids
from verifier.common.web import error_middleware
from verifier.db import make_engine, upgrade
from verifier.keyservice import KeyService
from verifier.keyservice.app import make_app as keyservice_app
from verifier.registrar import Registrar
from verifier.registrar import make_app as registrar_app

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
_REQ_ID = re.compile(
    r"^req-[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$"
)


async def _get(
    app: web.Application, path: str, method: str = "GET"
) -> tuple[int, str, str]:
    async with TestClient(TestServer(app)) as client:
        resp = await client.request(method, path)
        return resp.status, resp.headers.get(REQUEST_ID_HEADER, ""), await resp.text()


class ServiceConventionsTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.tmp = tmp.name

    def apps(self) -> dict[str, Callable[[], web.Application]]:
        engine = make_engine("sqlite:///" + os.path.join(self.tmp, "r.db"))
        self.addCleanup(engine.dispose)
        upgrade(engine)
        registrar = Registrar(engine)
        keys = KeyService(
            os.urandom(32),
            [ed25519.Ed25519PrivateKey.generate().public_key()],
            ed25519.Ed25519PrivateKey.generate(),
        )
        tpm = SoftTpmAdapter()
        agent = Agent(str(uuid.uuid4()), TpmAccess(lambda: tpm, shared=True), self.tmp)
        from trusted_testing.auth import open_auth
        from verifier.api.verifier_app import make_app as verifier_app

        return {
            "registrar": lambda: registrar_app(registrar, {"reader": ["r"]}),
            "keyservice": lambda: keyservice_app(keys, "PEM", {"tenant": ["t"]}),
            "agent": lambda: agent_app(agent, {"tenant": ["t"]}),
            "listener": lambda: listener_app(None, ["verifier"]),  # type: ignore[arg-type]
            "verifier": lambda: _verifier_app(verifier_app, open_auth()),
        }

    def test_every_service_answers_healthcheck_without_credentials(self) -> None:
        import asyncio

        for name, make in self.apps().items():
            for method in ("GET", "HEAD"):
                status, request_id, text = asyncio.run(
                    _get(make(), "/healthcheck", method)
                )
                self.assertEqual(200, status, name)
                self.assertRegex(request_id, _REQ_ID, name)
                if method == "GET":
                    self.assertEqual("OK", text, name)

    def test_every_response_has_a_fresh_request_id(self) -> None:
        import asyncio

        for name, make in self.apps().items():
            # a refusal (no client certificate, unknown path) carries one too
            _, first, _ = asyncio.run(_get(make(), "/v1/nowhere"))
            _, second, _ = asyncio.run(_get(make(), "/v1/nowhere"))
            self.assertRegex(first, _REQ_ID, name)
            self.assertNotEqual(first, second, name)

    def test_log_records_of_a_request_carry_its_id(self) -> None:
        import asyncio

        install_log_request_ids()
        logs = self.useFixture(fixtures.FakeLogger(format="%(request_id)s %(message)s"))
        seen: list[str] = []

        async def handler(request: web.Request) -> web.Response:
            logging.getLogger("test.handler").warning("serving")
            seen.append("x")
            return web.Response(text="x")

        app = web.Application(middlewares=[error_middleware])
        app.router.add_get("/x", handler)
        _, request_id, _ = asyncio.run(_get(app, "/x"))
        self.assertEqual(["x"], seen)
        self.assertIn(f"{request_id} serving", logs.output)


def _verifier_app(
    make: Callable[..., web.Application], auth: object
) -> web.Application:
    from unittest import mock

    verifier = mock.Mock()  # only routing and middlewares are exercised
    verifier.policies = mock.Mock()
    return make(verifier, "PEM", auth)


class VersionTest(testtools.TestCase):
    def test_every_console_script_prints_the_pbr_version(self) -> None:
        # outside the source tree, where a built egg-info could shadow the
        # installed distribution's metadata for "python -c"
        cwd = self.useFixture(fixtures.TempDir()).path
        expected = subprocess.run(
            [sys.executable, "-c", "import pbr.version as v; "
             "print(v.VersionInfo('trusted-cloud').release_string())"],
            capture_output=True, text=True, check=True, timeout=60, cwd=cwd,
        ).stdout.strip()  # fmt: skip
        parser = configparser.ConfigParser()
        parser.read(os.path.join(ROOT, "setup.cfg"))
        scripts = [
            line.split("=")[0].strip()
            for line in parser["entry_points"]["console_scripts"].splitlines()
            if line.strip()
        ]
        self.assertGreaterEqual(len(scripts), 12)
        bindir = os.path.dirname(sys.executable)
        for name in scripts:
            done = subprocess.run(
                [os.path.join(bindir, name), "--version"],
                capture_output=True,
                text=True,
                timeout=120,
                cwd=cwd,
            )
            self.assertEqual(0, done.returncode, f"{name}: {done.stderr}")
            self.assertEqual(f"{name} {expected}", done.stdout.strip(), name)
