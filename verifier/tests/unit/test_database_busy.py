"""A database that is busy answers 503 ``database_busy`` with
``Retry-After``, never a 500, and loses nothing already stored; the
tenant's tools ask again; an engine's errors never carry a statement's
parameters into a log.

The registrar runs on a real SQLite file while another connection holds
its write lock (as a write-behind of thousands of nodes does for longer
than the busy timeout, which made the enrolment storm of a 10,000-node
soak fail with 500 ``database is locked``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import tempfile
from typing import Any

import fixtures
import sqlalchemy as sa
import testtools
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from nova_plugin import services
from nova_plugin.exceptions import ServiceError
from nova_plugin.services import ServiceClient
from verifier.common import tls
from verifier.db import make_engine, upgrade
from verifier.registrar import Registrar
from verifier.registrar import make_app as registrar_app

INSTANCE = "6f1c2a44-0d1e-4c55-9a57-3b1f8e2d7c10"


class DatabaseBusyTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.path = os.path.join(tmp.name, "registrar.sqlite")
        self.engine = make_engine("sqlite:///" + self.path)
        self.addCleanup(self.engine.dispose)
        upgrade(self.engine)
        self.log = self.useFixture(fixtures.FakeLogger(level=logging.INFO))

    def _lock(self) -> sqlite3.Connection:
        """Another process's writer, holding the write lock."""
        holder = sqlite3.connect(self.path, isolation_level=None)
        self.addCleanup(holder.close)
        holder.execute("BEGIN EXCLUSIVE")
        return holder

    async def _story(self) -> list[tuple[int, str, Any]]:
        app = registrar_app(Registrar(self.engine))
        seen = []
        async with TestClient(TestServer(app)) as client:
            url = f"/v1/provider/instances/{INSTANCE}"

            async def call(method: str, body: Any = None) -> None:
                resp = await client.request(method, url, json=body)
                retry = resp.headers.get("Retry-After", "")
                seen.append((resp.status, retry, await resp.json()))

            await call("PUT", {"host": "compute-1"})
            holder = self._lock()
            await call("PUT", {"host": "compute-2"})  # after the busy timeout
            holder.execute("ROLLBACK")
            await call("GET")
            await call("PUT", {"host": "compute-2"})
        return seen

    def test_a_locked_database_is_a_503_that_loses_nothing(self) -> None:
        stored, busy, after, retried = asyncio.run(self._story())
        self.assertIn(stored[0], (200, 201), str(stored))
        status, retry, body = busy
        self.assertEqual((503, "1"), (status, retry), body)
        self.assertEqual("database_busy", body["error"]["code"])
        self.assertIn("nothing was changed", body["error"]["message"])
        self.assertEqual(200, after[0])
        # the first PUT kept
        self.assertEqual("compute-1", after[2]["host"], str(after))
        self.assertIn(retried[0], (200, 201), str(retried))
        self.assertIn("database busy serving PUT", self.log.output)
        self.assertIn("database is locked", self.log.output)
        self.assertNotIn("Traceback", self.log.output)

    def test_an_engine_error_never_shows_the_parameters(self) -> None:
        secret = "v-share-" + os.urandom(8).hex()
        with self.assertRaises(sa.exc.DBAPIError) as ctx:
            with self.engine.begin() as conn:
                conn.execute(
                    sa.text("INSERT INTO no_such_table VALUES (:v)"), {"v": secret}
                )
        self.assertNotIn(secret, str(ctx.exception))


class TenantRetryTest(testtools.TestCase):
    """The tenant's client asks again after a ``503 database_busy``."""

    def setUp(self) -> None:
        super().setUp()
        waits = (0.01, 0.01, 0.01)
        self.useFixture(fixtures.MockPatchObject(services, "_BUSY_WAITS", waits))

    async def _calls(self, busy_answers: int) -> tuple[int, Any]:
        answers = 0

        async def handler(request: web.Request) -> web.Response:
            nonlocal answers
            answers += 1
            if answers <= busy_answers:
                error = {"code": "database_busy", "message": "try again in 1 s"}
                return web.json_response({"error": error}, status=503)
            return web.json_response({"state": "registered"})

        app = web.Application()
        app.router.add_post("/v1/nodes", handler)
        async with TestServer(app) as server:
            client = ServiceClient(tls.client_context(None, None, None), 5.0)
            try:
                url = str(server.make_url("/v1/nodes"))
                try:
                    result: Any = await client.call("POST", url, {})
                except ServiceError as exc:
                    result = exc
            finally:
                await client.close()
        return answers, result

    def test_a_busy_database_is_asked_again(self) -> None:
        answers, result = asyncio.run(self._calls(2))
        self.assertEqual((3, {"state": "registered"}), (answers, result))

    def test_a_database_busy_for_long_is_the_service_error(self) -> None:
        answers, result = asyncio.run(self._calls(10))
        self.assertEqual(4, answers)
        self.assertIsInstance(result, ServiceError)
        self.assertEqual((503, "database_busy"), (result.status, result.code))
