"""A tenant's request context stays with its request (issue 19: the
verifier's quote-round log lines carried a tenant's request id and
identity, ``[None req-... cert:tenant tenant - - - -]`` in the soak's log).

The log lines are formatted as the services format them (oslo.log's
``ContextFormatter`` with its default format strings), after
``install_log_request_ids`` as every service runs it at start.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import os

from aiohttp.test_utils import TestClient, TestServer
from oslo_config import cfg
from oslo_context import context
from oslo_log import formatters
from oslo_log import log as oslo_log

from trusted_testing.auth import open_auth
from verifier.api.verifier_app import make_app
from verifier.attest.service import Verifier
from verifier.common import conventions
from verifier.tests.unit.test_attest_service import FakeAgent, VerifierServiceBase

_ROUND_LINES = ("failed attestation", "revoked")


class _Lines(logging.Handler):
    """Log lines of the ``verifier`` loggers as oslo.log formats them."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        conf = cfg.ConfigOpts()
        oslo_log.register_options(conf)
        conf([])
        self.setFormatter(formatters.ContextFormatter(config=conf))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))

    def having(self, *words: str) -> list[str]:
        return [line for line in self.lines if any(w in line for w in words)]


class RequestContextTest(VerifierServiceBase):
    async def asyncSetUp(self) -> None:
        await super().asyncSetUp()
        conventions.install_log_request_ids()
        self.log = _Lines()
        logger = logging.getLogger("verifier")
        old_level = logger.level
        logger.setLevel(logging.DEBUG)
        logger.addHandler(self.log)
        self.addCleanup(logger.setLevel, old_level)
        self.addCleanup(logger.removeHandler, self.log)

    def _tampered_agent(self) -> FakeAgent:
        agent = self.new_agent()
        agent.tpm.extend(16, hashlib.sha256(b"rootkit").digest())
        return agent

    async def _until_revoked(self, verifier: Verifier, uuid: str) -> None:
        for _ in range(3000):  # rounds run in the scheduler's tasks
            node = verifier.nodes.find(uuid)
            if node is not None and node.state.value == "revoked":
                return
            await asyncio.sleep(0.01)
        self.fail(f"node {uuid} was never revoked by the quote loop")

    async def test_quote_round_lines_after_a_tenant_request_carry_no_request_context(
        self,
    ) -> None:
        verifier = self.new_verifier()
        await verifier.start()  # as the service starts: before any request
        app = make_app(verifier, "PEM", open_auth())
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            agent = self._tampered_agent()
            body = {
                "uuid": agent.uuid,
                "v": base64.b64encode(os.urandom(32)).decode(),
                "policy": {"pcrs": {"16": [self._good_pcr16().hex()]}},
                "u_commitment": base64.b64encode(bytes(32)).decode(),
            }
            resp = await client.post("/v1/nodes", json=body)  # a tenant's
            self.assertEqual(201, resp.status, await resp.text())
            request_id = resp.headers[conventions.REQUEST_ID_HEADER]
            await self._until_revoked(verifier, agent.uuid)
        rounds = self.log.having(*_ROUND_LINES)
        self.assertGreaterEqual(len(rounds), 2)
        for line in rounds:
            self.assertNotIn(request_id, line)
            self.assertNotIn("req-", line)
            self.assertNotIn("noauth", line)
        (enrolled,) = self.log.having("Enrolled node")
        # the request's own line carries its id (the one its answer named)
        # and its caller
        self.assertIn(request_id, enrolled)
        self.assertIn("noauth", enrolled)

    async def test_tasks_started_while_a_request_is_served_do_not_inherit_it(
        self,
    ) -> None:
        verifier = self.new_verifier()
        agent = self._tampered_agent()
        await verifier.commands.enrol(agent.uuid, os.urandom(32), self.policy)
        # the service (and its quote loop) started from within a request
        request_id, tokens = conventions.new_request_id()
        context.RequestContext(
            user_id="cert:tenant", project_id="tenant", request_id=request_id
        )
        await verifier.start()
        conventions.reset_request_id(tokens)
        await self._until_revoked(verifier, agent.uuid)
        rounds = self.log.having(*_ROUND_LINES)
        self.assertGreaterEqual(len(rounds), 2)
        for line in rounds:
            self.assertNotIn(request_id, line)
            self.assertNotIn("cert:tenant", line)

    async def test_a_worker_thread_of_a_request_sees_its_context_and_keeps_none(
        self,
    ) -> None:
        """Database work a request starts on a thread logs with the
        request's context; the thread does not keep it afterwards."""
        request_id, tokens = conventions.new_request_id()
        mine = context.RequestContext(user_id="u", request_id=request_id)
        try:
            seen = await asyncio.to_thread(context.get_current)
        finally:
            conventions.reset_request_id(tokens)
        self.assertIs(mine, seen)
        self.assertIsNone(context.get_current())
        self.assertIsNone(await asyncio.to_thread(context.get_current))
