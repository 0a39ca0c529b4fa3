"""Batch enrolment (``POST /v1/nodes/batch``, issue 34 item 3): each node
of a batch is enrolled as ``enrol`` would enrol it alone, with one registrar
look-up and one transaction; a refused node does not stop the others, and
a registrar that cannot answer stores nothing."""

from __future__ import annotations

import dataclasses
import os
import uuid as uuid_mod

from verifier.attest import NodeView
from verifier.attest.quotas import Quotas
from verifier.exceptions import RequestError
from verifier.protocol.errors import FieldError, MalformedError
from verifier.protocol.messages.enrolment import (
    MAX_BATCH,
    EnrolmentBatch,
    EnrolmentRequest,
)
from verifier.tests.unit.test_attest_service import VerifierServiceBase


class BatchEnrolmentTest(VerifierServiceBase):
    def request(self, uuid: str, v: bytes | None = None) -> EnrolmentRequest:
        return EnrolmentRequest(
            uuid, v or os.urandom(32), self.policy, u_commitment=bytes(32)
        )

    def outcome(self, result: NodeView | RequestError) -> str:
        """``registered`` (the node's state) or the error's code."""
        if isinstance(result, RequestError):
            return result.code
        return str(result.state)

    async def test_each_node_is_judged_alone_with_one_registrar_look_up(
        self,
    ) -> None:
        verifier = self.new_verifier()
        good, other = self.new_agent(), self.new_agent()
        waiting = self.new_agent(activated=False)
        known = self.new_agent()
        await self.enrol(verifier, known)
        unknown = str(uuid_mod.uuid4())
        self.registrar.placements[other.uuid] = "compute-1"
        requests = [
            self.request(good.uuid),
            self.request(unknown),
            self.request(waiting.uuid),
            self.request(known.uuid),
            self.request(other.uuid),
            self.request(good.uuid),  # twice in the batch
        ]
        results = await verifier.commands.enrol_many(requests, project="p1")
        self.assertEqual(
            [
                "registered",
                "unknown_node",
                "ak_not_activated",
                "already_enrolled",
                "registered",
                "already_enrolled",
            ],
            [self.outcome(r) for r in results],
        )
        self.assertEqual(
            [[good.uuid, unknown, waiting.uuid, other.uuid]], self.registrar.lookups
        )
        stored = {v.uuid: v for v in await verifier.queries.list()}
        self.assertEqual({good.uuid, known.uuid, other.uuid}, set(stored))
        row = self.row(other.uuid)
        assert row is not None
        self.assertEqual(("p1", "compute-1"), (row.project_id, row.compute_host))

    async def test_a_batch_node_is_bootstrapped_and_gets_its_own_v(self) -> None:
        verifier = self.new_verifier()
        self.quiesce(verifier)
        agents = [self.new_agent() for _ in range(3)]
        shares = [os.urandom(32) for _ in agents]
        requests = [
            self.request(a.uuid, v) for a, v in zip(agents, shares, strict=True)
        ]
        results = await verifier.commands.enrol_many(requests)
        self.assertEqual(["registered"] * 3, [self.outcome(r) for r in results])
        for agent, share in zip(agents, shares, strict=True):
            view = await verifier.rounds.attest_once(agent.uuid)
            self.assertEqual("attested", view.state)
            self.assertEqual(share, agent.open_v(agent.v_posts[0]))

    async def test_the_quota_is_counted_through_the_batch(self) -> None:
        verifier = self.new_verifier(quotas=Quotas(nodes=3))
        first = self.new_agent()
        await verifier.commands.enrol(
            first.uuid, os.urandom(32), self.policy, project="p1"
        )
        agents = [self.new_agent() for _ in range(3)]
        results = await verifier.commands.enrol_many(
            [self.request(a.uuid) for a in agents], project="p1"
        )
        self.assertEqual(
            ["registered", "registered", "quota_exceeded"],
            [self.outcome(r) for r in results],
        )
        self.assertIsNone(self.row(agents[2].uuid))
        # another project's quota is its own
        other = self.new_agent()
        [result] = await verifier.commands.enrol_many([self.request(other.uuid)], "p2")
        self.assertEqual("registered", self.outcome(result))

    async def test_a_registrar_that_cannot_answer_stores_nothing(self) -> None:
        verifier = self.new_verifier()
        agents = [self.new_agent() for _ in range(2)]

        async def unreachable(uuids: list[str]) -> object:
            raise RequestError("registrar_unreachable", "cannot reach it", 502)

        self.registrar.lookup = unreachable  # type: ignore[method-assign]
        ahead = dataclasses.replace(
            self.request(str(uuid_mod.uuid4())), await_instance=True
        )
        with self.assertRaises(RequestError) as caught:
            await verifier.commands.enrol_many(
                [ahead] + [self.request(a.uuid) for a in agents]
            )
        self.assertEqual("registrar_unreachable", caught.exception.code)
        self.assertEqual([], await verifier.queries.list())

    async def test_a_node_enrolled_ahead_of_its_instance_waits_in_the_batch(
        self,
    ) -> None:
        verifier = self.new_verifier()
        agent = self.new_agent()
        ahead = dataclasses.replace(
            self.request(str(uuid_mod.uuid4())), await_instance=True
        )
        results = await verifier.commands.enrol_many([ahead, self.request(agent.uuid)])
        self.assertEqual(["pending", "registered"], [self.outcome(r) for r in results])
        self.assertEqual([[agent.uuid]], self.registrar.lookups)

    async def test_a_request_without_a_policy_is_refused_alone(self) -> None:
        verifier = self.new_verifier()
        good, bare = self.new_agent(), self.new_agent()
        empty = self.request(bare.uuid)
        object.__setattr__(empty, "policy", type(self.policy)({}))
        results = await verifier.commands.enrol_many([empty, self.request(good.uuid)])
        self.assertEqual(
            ["no_policy", "registered"], [self.outcome(r) for r in results]
        )


class EnrolmentBatchMessageTest(VerifierServiceBase):
    """The batch's wire form: refused whole, naming the item."""

    def body(self, n: int) -> list[dict[str, object]]:
        policy = {"pcrs": {"16": ["00" * 32]}}
        return [
            EnrolmentRequest(
                str(uuid_mod.uuid4()),
                bytes(32),
                type(self.policy).from_dict(policy),
                u_commitment=bytes(32),
            ).to_dict()
            for _ in range(n)
        ]

    def test_round_trip(self) -> None:
        nodes = self.body(2)
        batch = EnrolmentBatch.from_dict({"nodes": nodes})
        self.assertEqual({"nodes": nodes}, batch.to_dict())

    def test_empty_too_many_or_not_a_list_is_a_bad_field(self) -> None:
        for nodes in ([], self.body(1) * (MAX_BATCH + 1), {"a": 1}, None):
            with self.assertRaises(FieldError) as caught:
                EnrolmentBatch.from_dict({"nodes": nodes})
            self.assertEqual("nodes", caught.exception.field)

    def test_a_malformed_item_is_named_by_its_index(self) -> None:
        nodes = self.body(3)
        nodes[1] = dict(nodes[1], uuid="not-a-uuid")
        with self.assertRaises(MalformedError) as caught:
            EnrolmentBatch.from_dict({"nodes": nodes})
        self.assertIn("nodes.1", str(caught.exception))

    def test_unknown_fields_are_refused(self) -> None:
        with self.assertRaises(FieldError):
            EnrolmentBatch.from_dict({"nodes": self.body(1), "all": True})
        for junk in (None, [], "x", 3):
            with self.assertRaises(MalformedError):
                EnrolmentBatch.from_dict(junk)
