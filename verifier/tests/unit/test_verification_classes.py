"""Verification classes at the edges: the enrolment field ``interval``
(validated in the message, bounded by the verifier's
``min_node_interval``), stored with the node and used by its scheduler."""

from __future__ import annotations

import base64
import os
import uuid as uuid_mod
from typing import Any

import testtools

from verifier.exceptions import RequestError
from verifier.protocol import MalformedError
from verifier.protocol.messages.enrolment import EnrolmentRequest
from verifier.tests.unit.test_attest_service import VerifierServiceBase


def _body(**extra: Any) -> dict[str, Any]:
    return {
        "uuid": str(uuid_mod.uuid4()),
        "v": base64.b64encode(os.urandom(32)).decode(),
        "policy": {"pcrs": {"16": ["00" * 32]}},
        "u_commitment": base64.b64encode(bytes(32)).decode(),
        **extra,
    }


class IntervalFieldTest(testtools.TestCase):
    def test_interval_is_parsed_and_sent_back(self) -> None:
        request = EnrolmentRequest.from_dict(_body(interval=5))
        self.assertEqual(5.0, request.interval)
        self.assertEqual(5.0, request.to_dict()["interval"])
        self.assertEqual(request, EnrolmentRequest.from_dict(request.to_dict()))

    def test_no_interval_is_not_sent(self) -> None:
        request = EnrolmentRequest.from_dict(_body())
        self.assertIsNone(request.interval)
        self.assertNotIn("interval", request.to_dict())

    def test_bad_intervals_are_refused_naming_the_field(self) -> None:
        for bad in ("5", True, 0, -1, 0.01, 86401, 1e300, [], {}):
            e = self.assertRaises(
                MalformedError, EnrolmentRequest.from_dict, _body(interval=bad)
            )
            self.assertIn("interval", str(e))

    def test_a_push_node_may_have_its_own_interval(self) -> None:
        request = EnrolmentRequest.from_dict(_body(interval=5, mode="push"))
        self.assertEqual((5.0, "push"), (request.interval, request.mode.value))
        self.assertEqual(request, EnrolmentRequest.from_dict(request.to_dict()))


class ServiceIntervalTest(VerifierServiceBase):
    async def test_a_node_keeps_its_own_interval(self) -> None:
        verifier = self.new_verifier()
        agent = self.new_agent()
        view = await verifier.commands.enrol(
            agent.uuid, os.urandom(32), self.policy, interval=7.5
        )
        self.quiesce(verifier)
        self.assertEqual(7.5, view.interval)
        row = self.row(agent.uuid)
        assert row is not None
        self.assertEqual(7.5, row.quote_interval)
        node = verifier.nodes.live(agent.uuid)
        self.assertEqual(7.5, verifier.settings.interval_of(node))
        self.assertEqual(7.5, (await verifier.queries.get(agent.uuid)).interval)

    async def test_a_node_without_one_gets_the_verifiers(self) -> None:
        verifier = self.new_verifier()
        agent = self.new_agent()
        await self.enrol(verifier, agent)
        self.assertEqual(
            0.01, verifier.settings.interval_of(verifier.nodes.live(agent.uuid))
        )
        self.assertIsNone((await verifier.queries.get(agent.uuid)).interval)

    async def test_shorter_than_min_node_interval_is_refused(self) -> None:
        verifier = self.new_verifier()
        agent = self.new_agent()
        with self.assertRaises(RequestError) as ctx:
            await verifier.commands.enrol(
                agent.uuid, os.urandom(32), self.policy, interval=0.5
            )
        self.assertEqual("interval_too_short", ctx.exception.code)
        self.assertEqual(400, ctx.exception.status)
        self.assertIsNone(self.row(agent.uuid))
