"""The verifier's database reads and write-behind run off its event loop
(issue 19: under overload ``GET /v1/signing-key`` waited 17 s behind the
node list and the counters, which queried the database on the loop).

Each test holds one database call of the real service (on its real SQLite
database) inside the call until the test lets it go, and meanwhile asks the
same verifier's API for its signing key. Only a loop that is not stuck in
that call can answer; the held call then completes with the right answer.
No time is measured: the order of events is the proof (on the old code the
held call waits out its bound and the key comes after it).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading
import unittest
from collections.abc import Awaitable, Callable
from typing import Any

import sqlalchemy as sa
from aiohttp.test_utils import TestClient, TestServer

from trusted_testing.auth import open_auth
from verifier.api.verifier_app import make_app
from verifier.attest.service import Verifier
from verifier.db import make_engine, upgrade
from verifier.protocol.attestation import Transition
from verifier.registrar import Registrar
from verifier.registrar import make_app as make_registrar_app
from verifier.tests.unit.test_attest_service import VerifierServiceBase

_BOUND = 20.0  # the held call gives up after this (only on the old code)


class HeldCall:
    """Wraps ``owner.name`` so that each call waits, inside the call and
    on whatever thread makes it, until :meth:`release`."""

    def __init__(self, owner: Any, name: str) -> None:
        self.entered = threading.Event()
        self._released = threading.Event()
        self.waited_out = False
        real = getattr(owner, name)

        def held(*args: Any, **kwargs: Any) -> Any:
            self.entered.set()
            if not self._released.wait(_BOUND):
                self.waited_out = True
            return real(*args, **kwargs)

        setattr(owner, name, held)

    async def wait_entered(self) -> None:
        await asyncio.to_thread(self.entered.wait, _BOUND)
        assert self.entered.is_set(), "the call was never made"

    def release(self) -> None:
        self._released.set()


class DatabaseOffLoopTest(VerifierServiceBase):
    async def asyncSetUp(self) -> None:
        await super().asyncSetUp()
        self.verifier = self.new_verifier()
        self.agent = self.new_agent()
        await self.enrol(self.verifier, self.agent)
        await self.verifier.rounds.attest_once(self.agent.uuid)
        await self._serve(self.verifier)

    async def _serve(self, verifier: Verifier) -> None:
        app = make_app(verifier, "THE-SIGNING-KEY", open_auth())
        self.client = TestClient(TestServer(app, host="127.0.0.1"))
        await self.client.start_server()
        self.addAsyncCleanup(self.client.close)

    async def _served_while_held(
        self, held: HeldCall, call: Callable[[], Awaitable[Any]]
    ) -> Any:
        """Start ``call``; once it is inside the held database call, the
        signing key must be served; then let the call finish."""
        task = asyncio.ensure_future(call())
        try:
            await held.wait_entered()
            resp = await self.client.get("/v1/signing-key")
            self.assertEqual(200, resp.status)
            self.assertEqual("THE-SIGNING-KEY", await resp.text())
            # answered while the database call is still held
            self.assertFalse(task.done())
            self.assertFalse(held.waited_out)
        finally:
            held.release()
        result = await task
        self.assertFalse(held.waited_out)
        return result

    async def _get_json(self, path: str) -> Any:
        resp = await self.client.get(path)
        self.assertEqual(200, resp.status)
        return await resp.json()

    async def test_stats_query_does_not_block_the_loop(self) -> None:
        held = HeldCall(self.verifier.store, "states")
        stats = await self._served_while_held(held, lambda: self._get_json("/v1/stats"))
        self.assertEqual(1, stats["nodes"])
        self.assertEqual(1, stats["states"]["attested"])

    async def test_node_list_query_does_not_block_the_loop(self) -> None:
        held = HeldCall(self.verifier.store, "load_all")
        listed = await self._served_while_held(
            held, lambda: self._get_json("/v1/nodes")
        )
        self.assertEqual([self.agent.uuid], [n["uuid"] for n in listed["nodes"]])

    async def test_node_of_another_process_is_read_off_the_loop(self) -> None:
        # a verifier process that does not attest the node reads it from
        # the shared database
        other = self.new_verifier()
        await self._serve(other)
        held = HeldCall(other.store, "load")
        view = await self._served_while_held(
            held, lambda: self._get_json(f"/v1/nodes/{self.agent.uuid}")
        )
        self.assertEqual("attested", view["state"])

    async def test_event_list_query_does_not_block_the_loop(self) -> None:
        held = HeldCall(self.verifier.outbox, "page")
        events = await self._served_while_held(
            held, lambda: self._get_json("/v1/events")
        )
        self.assertEqual([], events["events"])

    async def test_write_behind_does_not_block_the_loop(self) -> None:
        await self.verifier.rounds.attest_once(self.agent.uuid)  # dirty hot state
        held = HeldCall(self.verifier.store, "write_hot")
        await self._served_while_held(held, self.verifier.write_behind.write)
        row = self.row(self.agent.uuid)
        assert row is not None
        self.assertEqual(2, row.quotes_verified)

    async def test_write_behind_never_overwrites_a_newer_state_write(
        self,
    ) -> None:
        """The hot state is taken on the loop and written later: a quote
        verified (and its state written) in between is newer and stays."""
        node = self.verifier.nodes.live(self.agent.uuid)
        await self.verifier.rounds.attest_once(self.agent.uuid)  # 2 quotes, dirty
        rows = self.verifier.store.hot_rows([node])
        await self.verifier.rounds.attest_once(self.agent.uuid)  # 3
        self.verifier.store.update_state(node, Transition(node.state))
        self.verifier.store.write_hot(rows)  # the older values, late
        row = self.row(self.agent.uuid)
        assert row is not None
        self.assertEqual(3, row.quotes_verified)

    async def test_failed_write_behind_leaves_the_nodes_dirty(self) -> None:
        node = self.verifier.nodes.live(self.agent.uuid)
        await self.verifier.rounds.attest_once(self.agent.uuid)
        good = self.verifier.store.engine
        self.addCleanup(setattr, self.verifier.store, "engine", good)
        self.verifier.store.engine = sa.create_engine("sqlite:////nonexistent/dir/db")
        with self.assertRaises(sa.exc.OperationalError):
            await self.verifier.write_behind.write()
        self.assertTrue(node.dirty)
        self.verifier.store.engine = good
        await self.verifier.write_behind.write()
        self.assertFalse(node.dirty)
        row = self.row(self.agent.uuid)
        assert row is not None
        self.assertEqual(2, row.quotes_verified)


class RegistrarOffLoopTest(unittest.IsolatedAsyncioTestCase):
    """The registrar's reads (the verifier asks it for a node's record at
    every enrolment) leave its loop free too."""

    async def test_agent_list_query_does_not_block_the_loop(self) -> None:
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        engine = make_engine("sqlite:///" + os.path.join(tmp.name, "r.db"))
        self.addCleanup(engine.dispose)
        upgrade(engine)
        registrar = Registrar(engine)
        held = HeldCall(registrar, "list")
        async with TestClient(TestServer(make_registrar_app(registrar))) as client:

            async def agents() -> Any:
                resp = await client.get("/v1/agents")
                self.assertEqual(200, resp.status)
                return await resp.json()

            task = asyncio.ensure_future(agents())
            try:
                await held.wait_entered()
                resp = await client.get("/healthcheck")  # another request
                self.assertEqual(200, resp.status)
                self.assertFalse(task.done())
                self.assertFalse(held.waited_out)
            finally:
                held.release()
            self.assertEqual({"agents": []}, await task)
            self.assertFalse(held.waited_out)


class _FailingSecondBegin:
    """An engine whose second transaction cannot start."""

    def __init__(self, engine: sa.Engine) -> None:
        self._engine = engine
        self.begun = 0

    def begin(self) -> Any:
        self.begun += 1
        if self.begun == 2:
            raise sa.exc.OperationalError("BEGIN", {}, Exception("locked"))
        return self._engine.begin()


class WriteBehindChunksTest(VerifierServiceBase):
    async def test_a_failed_chunk_leaves_only_the_unwritten_nodes_dirty(
        self,
    ) -> None:
        verifier = self.new_verifier()
        agents = [self.new_agent(), self.new_agent()]
        for agent in agents:
            await self.enrol(verifier, agent)
            await verifier.rounds.attest_once(agent.uuid)
            await verifier.rounds.attest_once(agent.uuid)  # 2 quotes, dirty
        nodes = [verifier.nodes.live(a.uuid) for a in agents]
        rows = verifier.store.hot_rows(nodes)
        good = verifier.store.engine
        self.addCleanup(setattr, verifier.store, "engine", good)
        verifier.store.engine = _FailingSecondBegin(good)  # type: ignore[assignment]
        with self.assertRaises(sa.exc.OperationalError):
            verifier.store.write_hot(rows, chunk=1)
        first, second = (row[0] for row in rows)
        self.assertFalse(first.dirty)  # its chunk was committed
        self.assertTrue(second.dirty)  # written next time
        stored = self.row(first.uuid)
        assert stored is not None
        self.assertEqual(2, stored.quotes_verified)
