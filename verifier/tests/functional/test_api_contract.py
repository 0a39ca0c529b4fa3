"""The API contract (issue 18): every service serves its OpenAPI 3
document, and schemathesis, run against the running service on 127.0.0.1,
finds no 5xx and no answer outside the contract (status, content type,
error body schema). Roles are off (no TLS): the contract is about what the
services answer to any input, not about who may ask.

Also checks the API reference (doc/source/api.rst) names every route of
every document.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any

import jsonschema
import testtools
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric import ed25519
from sqlalchemy.orm import Session

from ipsec_puppet_vault_hooks import Consumer
from ipsec_puppet_vault_hooks.listener import EventHandler
from ipsec_puppet_vault_hooks.listener import make_app as listener_app
from node_agent.agent import Agent, TpmAccess
from node_agent.server import make_app as agent_app
from node_agent.tests.unit.test_agent import SoftTpmAdapter
from trusted_testing import hooks_events
from trusted_testing.auth import open_auth
from trusted_testing.lean_serve import LeanTestServer
from verifier.api.push_app import make_push_app
from verifier.api.verifier_app import make_app as verifier_app
from verifier.api.verifier_app import public_pem
from verifier.attest.node import enrolment_row
from verifier.attest.service import Verifier
from verifier.attest.settings import VerifierSettings
from verifier.common import api_schemas
from verifier.common.lean_server import LeanApp
from verifier.common.openapi import document
from verifier.db import Host, make_engine, upgrade
from verifier.exceptions import AgentUnreachableError, NotFoundError
from verifier.keyservice import KeyService
from verifier.keyservice import make_app as keyservice_app
from verifier.notify import Outbox
from verifier.notify.outbox import add_to_outbox, make_event
from verifier.protocol import PcrPolicy
from verifier.registrar import Registrar
from verifier.registrar import make_app as registrar_app
from verifier.tlog import REVOKED, stage
from verifier.tlog.sequencer import LogSequencer

ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
)
ST = os.path.join(os.path.dirname(sys.executable), "st")
NODE = "3f2a6c1e-5b1d-4c1e-9a7e-0c6d2b8e4f10"
HOST = "7d7ac7b4-0c5a-4d0e-9c57-4f4b0a0c0b0a"
#: The query a GET needs to answer with a body.
_QUERY = {"/v1/log/consistency": "?from=0&to=1"}
#: loopback only: never through a proxy from the environment
_get = urllib.request.build_opener(urllib.request.ProxyHandler({})).open


def _json_schema(schema: Any) -> Any:
    """An OpenAPI 3.0 schema as JSON Schema (``nullable`` -> null type)."""
    if isinstance(schema, list):
        return [_json_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _json_schema(v) for k, v in schema.items() if k != "nullable"}
    if schema.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


class _NoRegistrar:
    async def placement(self, uuid: str) -> str | None:
        return None

    async def get_agent(self, node_uuid: str) -> Any:
        raise NotFoundError("unknown_node", f"the registrar does not know {node_uuid}")

    async def lookup(self, uuids: list[str]) -> tuple[dict[str, Any], dict[str, str]]:
        return {}, {}

    async def close(self) -> None:
        pass


class _NoAgents:
    async def call(self, *args: Any, **kwargs: Any) -> Any:
        raise AgentUnreachableError("no agents here")

    def forget(self, *args: Any) -> None:
        pass

    async def close(self) -> None:
        pass


App = web.Application | LeanApp


def _document(app: App, name: str) -> dict[str, Any]:
    return app.document() if isinstance(app, LeanApp) else document(app, name)


class Served:
    """An aiohttp application built and served on 127.0.0.1 in a thread."""

    def __init__(self, build: Callable[[], App]) -> None:
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._build = build
        self.port = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not self._ready.wait(60):
            raise RuntimeError("the service did not start")

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        app = self._build()
        if isinstance(app, LeanApp):  # the push endpoint
            self.lean = LeanTestServer(app)
            self.loop.run_until_complete(self.lean.start_server())
            self.port = self.lean.port
            self._ready.set()
            self.loop.run_forever()
            return
        self.runner = web.AppRunner(app, access_log=None)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._ready.set()
        self.loop.run_forever()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        async def down() -> None:
            if hasattr(self, "lean"):
                await self.lean.close()
            else:
                await self.runner.cleanup()

        asyncio.run_coroutine_threadsafe(down(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)


class ApiContractTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.tmp = tmp.name

    def _engine(self, name: str) -> Any:
        engine = make_engine("sqlite:///" + os.path.join(self.tmp, name))
        upgrade(engine)
        self.addCleanup(engine.dispose)
        return engine

    # -- the services --------------------------------------------------------

    def _registrar(self) -> web.Application:
        return registrar_app(Registrar(self._engine("r.db")))

    def _verifier(self) -> web.Application:
        key = ed25519.Ed25519PrivateKey.generate()
        engine = self._engine("v.db")
        # one enrolled node and one revocation event, so that the node list
        # and the event list answer with bodies to check against the schema
        now = time.time()
        with Session(engine) as session, session.begin():
            session.add(
                enrolment_row(
                    NODE, os.urandom(32), PcrPolicy({}), None, (None, None), now
                )
            )
            event = make_event(key, NODE, "pcr_policy", "x", now)
            add_to_outbox(session, event, now)
            # and its entry in the attestation log, for the history's body
            stage(session, REVOKED, NODE, "", "pcr_policy", "x", now, event.event.id)
            # and a compute host, for the host routes' bodies
            host = enrolment_row(HOST, b"", PcrPolicy({}), None, (None, None), now)
            host.kind, host.v_released = "host", True
            session.add(host)
            session.flush()
            session.add(
                Host(
                    uuid=HOST,
                    hypervisor_hostname="compute-1",
                    ek_sha256="ab" * 32,
                    ca_path="/var/lib/swtpm-localca/issuercert.pem",
                    created_at=now,
                )
            )
        LogSequencer(engine, key).sequence_all()
        verifier = Verifier(
            engine,
            key,
            _NoRegistrar(),  # type: ignore[arg-type]
            _NoAgents(),  # type: ignore[arg-type]
            Outbox(engine, []),
            None,
            VerifierSettings(interval=1.0),
        )
        return verifier_app(verifier, public_pem(key.public_key()), open_auth())

    def _push(self) -> LeanApp:
        key = ed25519.Ed25519PrivateKey.generate()
        engine = self._engine("p.db")
        verifier = Verifier(
            engine,
            key,
            _NoRegistrar(),  # type: ignore[arg-type]
            _NoAgents(),  # type: ignore[arg-type]
            Outbox(engine, []),
            None,
            VerifierSettings(interval=1.0),
        )
        return make_push_app(verifier.push)

    def _keyservice(self) -> web.Application:
        svc = KeyService(
            os.urandom(32),
            [ed25519.Ed25519PrivateKey.generate().public_key()],
            ed25519.Ed25519PrivateKey.generate(),
        )
        return keyservice_app(svc, "PEM")

    def _agent(self) -> web.Application:
        tpm = SoftTpmAdapter()
        agent = Agent(
            str(uuid.uuid4()),
            TpmAccess(lambda: tpm, shared=True),
            os.path.join(self.tmp, "agent"),
            payload_timeout=10,
        )
        return agent_app(agent)

    def _listener(self) -> web.Application:
        key = ed25519.Ed25519PrivateKey.generate()
        consumer = Consumer([key.public_key()], [hooks_events.RecordingAction()])
        return listener_app(EventHandler(consumer), ["verifier"])

    def _serve(self, build: Callable[[], App]) -> Served:
        served = Served(build)
        self.addCleanup(served.stop)
        return served

    # -- the documents ----------------------------------------------------------

    def _services(self) -> dict[str, Callable[[], App]]:
        return {
            "registrar": self._registrar,
            "verifier": self._verifier,
            "push": self._push,
            "keyservice": self._keyservice,
            "agent": self._agent,
            "listener": self._listener,
        }

    def test_every_service_serves_its_openapi_document(self) -> None:
        for name, build in self._services().items():
            doc = _document(build(), name)
            self.assertEqual("3.0.3", doc["openapi"])
            self.assertIn("/v1/openapi.json", doc["paths"], name)
            for path, operations in doc["paths"].items():
                for method, op in operations.items():
                    self.assertIn("4XX", op["responses"], f"{method} {path}")
                    self.assertNotIn("5XX", op["responses"], f"{method} {path}")

    def test_main_routes_declare_their_success_body(self) -> None:
        # without a schema, response_schema_conformance judges only refusals
        maps = {
            "registrar": api_schemas.REGISTRAR,
            "verifier": api_schemas.VERIFIER,
            "agent": api_schemas.AGENT,
            "listener": api_schemas.LISTENER,
        }
        for name, responses in maps.items():
            served = self._serve(self._services()[name])
            with _get(f"{served.url}/v1/openapi.json") as resp:
                doc = json.load(resp)
            for method, path in responses:
                op = doc["paths"][path][method.lower()]
                content = op["responses"]["2XX"]["content"]
                self.assertEqual(
                    responses[(method, path)],
                    content["application/json"]["schema"],
                    f"{name} {method} {path}",
                )

    def test_success_bodies_conform_to_their_schemas(self) -> None:
        served = self._serve(self._verifier)
        checked = 0
        for (method, path), schema in api_schemas.VERIFIER.items():
            if method != "GET":
                continue
            path = path.replace("{uuid}", NODE).replace("{host}", "compute-1")
            url = served.url + path + _QUERY.get(path, "")
            with _get(url) as resp:
                body = json.load(resp)
            jsonschema.validate(body, _json_schema(schema))
            checked += 1
        self.assertGreaterEqual(checked, 4)
        # the seeded node and event are in the lists that were checked
        with _get(served.url + "/v1/events") as resp:
            self.assertEqual(1, len(json.load(resp)["events"]))
        # and a body that breaks the schema is caught
        self.assertRaises(
            jsonschema.ValidationError,
            jsonschema.validate,
            {"nodes": [{"uuid": NODE, "state": "bogus"}]},
            _json_schema(api_schemas.VERIFIER[("GET", "/v1/nodes")]),
        )

    def test_api_reference_names_every_route(self) -> None:
        with open(
            os.path.join(ROOT, "doc", "source", "api.rst"), encoding="utf-8"
        ) as f:
            text = re.sub(r"{[^}]*}", "{}", f.read())
        missing = []
        for name, build in self._services().items():
            for path in _document(build(), name)["paths"]:
                if re.sub(r"{[^}]*}", "{}", path) not in text:
                    missing.append(f"{name} {path}")
        self.assertEqual([], missing)

    # -- schemathesis against the running services -----------------------------

    def _schemathesis(self, build: Callable[[], App]) -> None:
        if not shutil.which(ST):
            self.skipTest("schemathesis is not installed (test-requirements.txt)")
        served = self._serve(build)
        proc = subprocess.run(
            [
                ST,
                "run",
                f"{served.url}/v1/openapi.json",
                "--checks",
                "not_a_server_error,status_code_conformance,"
                "content_type_conformance,response_schema_conformance",
                "--max-examples",
                "25",
                "--phases",
                "examples,coverage,fuzzing",
                "--workers",
                "1",
                "--suppress-health-check",
                "all",
                "--no-color",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=self.tmp,
        )
        self.assertEqual(0, proc.returncode, proc.stdout[-6000:] + proc.stderr[-2000:])

    def test_registrar_contract_holds_under_schemathesis(self) -> None:
        self._schemathesis(self._registrar)

    def test_verifier_contract_holds_under_schemathesis(self) -> None:
        self._schemathesis(self._verifier)

    def test_push_endpoint_contract_holds_under_schemathesis(self) -> None:
        self._schemathesis(self._push)

    def test_keyservice_contract_holds_under_schemathesis(self) -> None:
        self._schemathesis(self._keyservice)

    def test_agent_contract_holds_under_schemathesis(self) -> None:
        self._schemathesis(self._agent)

    def test_listener_contract_holds_under_schemathesis(self) -> None:
        self._schemathesis(self._listener)
