"""Fail closed in the verifier's quote loop (issue 18): whatever happens
while a node's evidence is obtained or judged changes its state with a
named reason, and every failure that takes it out of ``attested`` emits a
signed event.

The answers that are not evidence come from a real HTTPS server on
127.0.0.1 through the verifier's real :class:`VerifierAgentClient` (pinned TLS,
the one HTTP client): the bodies an attacker's agent would send.
"""

from __future__ import annotations

import json
import os
import ssl
import time
from collections.abc import Mapping
from typing import Any
from unittest import mock

import sqlalchemy as sa
from aiohttp import web

from verifier.attest.clients import VerifierAgentClient
from verifier.common.tls import self_signed_certificate, write_private
from verifier.protocol import SignedEvent
from verifier.protocol.attestation import NodeAttestation
from verifier.tests.unit.test_attest_service import FakeAgent, VerifierServiceBase


class LoopbackAgent:
    """A :class:`FakeAgent` served over real HTTPS on 127.0.0.1; ``raw``
    (when set) is the 200 answer to every quote request instead."""

    def __init__(self, agent: FakeAgent, workdir: str) -> None:
        self.agent = agent
        self.raw: bytes | None = None
        key, cert = self_signed_certificate("loopback-agent", ["127.0.0.1"])
        self.cert_file = os.path.join(workdir, "agent.pem")
        self.key_file = os.path.join(workdir, "agent-key.pem")
        with open(self.cert_file, "wb") as f:
            f.write(cert)
        write_private(self.key_file, key)
        agent.tls_cert = cert.decode()
        self._runner: web.AppRunner | None = None

    async def _quote(self, request: web.Request) -> web.Response:
        if self.raw is not None:
            return web.Response(body=self.raw, content_type="application/json")
        return web.json_response(await self.agent.quote(request.query))

    async def _v(self, request: web.Request) -> web.Response:
        self.agent.v_posts.append(await request.json())
        return web.json_response({"bootstrapped": True})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/v1/quote", self._quote)
        app.router.add_post("/v1/keys/v", self._v)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.cert_file, self.key_file)
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=ctx)
        await site.start()
        server = site._server
        assert server is not None
        self.agent.host = "127.0.0.1"
        self.agent.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


class FailClosedTest(VerifierServiceBase):
    """Each case of issue 18's "Why" about the quote loop."""

    def _event_types(self) -> list[tuple[str, str]]:
        out = []
        for row in self.outbox_rows():
            event = SignedEvent.from_dict(json.loads(row.body)).verify(self.public_key)
            out.append((event.type, event.reason))
        return out

    # -- answers that are not evidence, through the real client ------------

    async def _attested_over_https(self) -> tuple[Any, LoopbackAgent, FakeAgent]:
        agent = FakeAgent("3f2a6c1e-5b1d-4c1e-9a7e-0c6d2b8e4f10", 0)
        served = LoopbackAgent(agent, self.tmp)
        await served.start()
        self.addAsyncCleanup(served.stop)
        self.registrar.add(agent)
        key, cert = self_signed_certificate("verifier", [])
        cert_file = os.path.join(self.tmp, "verifier.pem")
        key_file = os.path.join(self.tmp, "verifier-key.pem")
        with open(cert_file, "wb") as f:
            f.write(cert)
        write_private(key_file, key)
        self.agents = VerifierAgentClient(cert_file, key_file, 10.0)  # type: ignore[assignment]
        verifier = self.new_verifier()
        await self.enrol(verifier, agent)
        view = await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual("attested", view.state)
        return verifier, served, agent

    async def _answer_revokes(self, body: bytes, says: str) -> None:
        verifier, served, agent = await self._attested_over_https()
        served.raw = body
        view = await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual("revoked", view.state)
        self.assertIn(says, view.failure_reason)
        self.assertEqual([("node.revoked", "malformed")], self._event_types())

    async def test_answer_200_not_json_revokes_the_attested_node(self) -> None:
        await self._answer_revokes(b"<html>hello</html>", "not JSON")

    async def test_answer_200_json_array_revokes_the_attested_node(self) -> None:
        await self._answer_revokes(b"[1, 2, 3]", "not a JSON object")

    async def test_answer_200_integer_over_64_bits_revokes_the_attested_node(
        self,
    ) -> None:
        big = b'{"quote": 123456789012345678901234567890, "nk": 1}'
        await self._answer_revokes(big, "malformed")

    async def test_answer_200_deeply_nested_json_revokes_the_attested_node(
        self,
    ) -> None:
        deep = b'{"quote": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        await self._answer_revokes(deep, "malformed")

    # -- exceptions outside the expected ones --------------------------------

    async def _attested(self) -> tuple[Any, FakeAgent]:
        verifier = self.new_verifier()
        agent = self.new_agent()
        await self.enrol(verifier, agent)
        view = await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual("attested", view.state)
        return verifier, agent

    async def test_unexpected_error_obtaining_evidence_fails_the_node(self) -> None:
        verifier, agent = await self._attested()
        original = self.agents.call

        async def broken(*args: Any, **kwargs: Any) -> Mapping[str, Any]:
            raise RuntimeError("the client broke on these bytes")

        self.agents.call = broken  # type: ignore[method-assign]
        view = await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual("failed", view.state)
        self.assertEqual(
            "internal_error: RuntimeError: the client broke on these bytes",
            view.failure_reason,
        )
        row = self.row(agent.uuid)
        assert row is not None
        self.assertEqual("failed", row.state)
        self.assertEqual([("node.failed", "internal_error")], self._event_types())
        # still polled: a good quote brings it back, and consumers learn it
        self.agents.call = original  # type: ignore[method-assign]
        view = await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual("attested", view.state)
        self.assertEqual(
            [("node.failed", "internal_error"), ("node.recovered", "recovered")],
            self._event_types(),
        )

    async def test_unexpected_error_judging_evidence_revokes_the_node(self) -> None:
        verifier, agent = await self._attested()
        broken = ZeroDivisionError("a check broke")
        with mock.patch.object(NodeAttestation, "_judge", side_effect=broken):
            view = await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual("revoked", view.state)
        self.assertTrue(view.failure_reason.startswith("check_error:"))
        self.assertEqual([("node.revoked", "check_error")], self._event_types())

    async def test_unexpected_error_releasing_v_fails_the_node(self) -> None:
        verifier = self.new_verifier()
        agent = self.new_agent()
        await self.enrol(verifier, agent)

        def broken(*args: Any) -> Any:
            raise ValueError("the CA broke")

        assert self.ca is not None  # the verifier's CA
        self.ca.sign_csr = broken  # type: ignore[method-assign]
        view = await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual("failed", view.state)
        self.assertIn("ValueError: the CA broke", view.failure_reason)
        self.assertEqual([], agent.v_posts)
        self.assertEqual([("node.failed", "internal_error")], self._event_types())

    # -- unreachable ----------------------------------------------------------

    async def test_unreachable_attested_node_is_unreachable_with_a_signed_event(
        self,
    ) -> None:
        verifier, agent = await self._attested()
        agent.unreachable = True
        for _ in range(5):
            view = await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual("unreachable", view.state)
        self.assertIn("unreachable", view.failure_reason)
        # one event for leaving attested, not one per round
        self.assertEqual([("node.unreachable", "unreachable")], self._event_types())
        self.assertEqual(1, verifier.outbox.dispatch_once())
        (delivered,) = self.notifier.events
        self.assertEqual("node.unreachable", delivered["event"]["type"])

    async def test_agent_restart_recovers_with_a_signed_event_and_no_revocation(
        self,
    ) -> None:
        verifier, agent = await self._attested()
        agent.unreachable = True  # its agent restarts
        for _ in range(5):
            await verifier.rounds.attest_once(agent.uuid)
        agent.unreachable = False  # and answers again, in the same boot
        view = await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual(("attested", None), (view.state, view.failure_reason))
        self.assertEqual(
            [("node.unreachable", "unreachable"), ("node.recovered", "recovered")],
            self._event_types(),
        )

    async def test_node_silent_past_the_timeout_is_revoked(self) -> None:
        verifier, agent = await self._attested()
        agent.unreachable = True
        for _ in range(5):
            view = await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual("unreachable", view.state)
        node = verifier.nodes.live(agent.uuid)
        node._last_attested_at = time.time() - 901.0  # 15 minutes pass
        view = await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual("revoked", view.state)
        self.assertTrue(view.failure_reason.startswith("unreachable_timeout: "))
        self.assertEqual(
            [
                ("node.unreachable", "unreachable"),
                ("node.revoked", "unreachable_timeout"),
            ],
            self._event_types(),
        )

    async def test_failed_event_belongs_to_the_node_project(self) -> None:
        # A tenant lists its events by project: an event staged without the
        # node's project was never shown to its owner.
        verifier = self.new_verifier()
        agent = self.new_agent()
        await verifier.commands.enrol(
            agent.uuid, os.urandom(32), self.policy, project="alpha"
        )
        self.quiesce(verifier)
        self.assertEqual(
            "attested", (await verifier.rounds.attest_once(agent.uuid)).state
        )
        agent.unreachable = True
        for _ in range(5):
            await verifier.rounds.attest_once(agent.uuid)
        types = [
            SignedEvent.from_dict(e["signed_event"]).verify(self.public_key).type
            for e in verifier.outbox.list(project="alpha")
        ]
        self.assertEqual(["node.unreachable"], types)
        self.assertEqual([], verifier.outbox.list(project="beta"))

    async def test_failed_event_is_written_once_by_racing_verifiers(self) -> None:
        first, agent = await self._attested()
        second = self.new_verifier()
        await second.sync.sync()
        self.quiesce(second)
        agent.unreachable = True
        for _ in range(3):
            await first.rounds.attest_once(agent.uuid)
            await second.rounds.attest_once(agent.uuid)
        self.assertEqual([("node.unreachable", "unreachable")], self._event_types())

    async def test_database_error_still_propagates(self) -> None:
        # A verdict that cannot be written is not a verdict on the node.
        verifier, agent = await self._attested()
        agent.unreachable = True
        verifier.store.engine = sa.create_engine("sqlite:////nonexistent/dir/db")
        with self.assertRaises(sa.exc.OperationalError):
            for _ in range(5):
                await verifier.rounds.attest_once(agent.uuid)
