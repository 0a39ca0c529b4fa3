"""``POST /v1/nodes/batch`` under Keystone: a project enrols its own
instances in one request, each node's outcome in the answer; another
project's instance is refused in the batch as it would be alone, and
bad input is refused whole with nothing stored."""

from __future__ import annotations

from verifier.tests.functional.tenancy_base import KeystoneTestBase, unittest


class BatchEnrolmentApiTest(KeystoneTestBase):
    async def test_a_batch_enrols_the_projects_own_nodes_each_with_its_outcome(
        self,
    ) -> None:
        mine = [self.new_agent() for _ in range(2)]
        for agent in mine:
            self.nova.add_server(agent.uuid, self.project_of("alice"))
        bobs = self.new_agent()
        self.nova.add_server(bobs.uuid, self.project_of("bob"))
        body = {"nodes": [self.enrolment(a.uuid) for a in (mine[0], bobs, mine[1])]}
        status, data = await self.call("alice", "POST", "/v1/nodes/batch", body)
        self.assertEqual(200, status, data)
        got = [(i["uuid"], i["status"]) for i in data["nodes"]]
        self.assertEqual(
            [(mine[0].uuid, 201), (bobs.uuid, 404), (mine[1].uuid, 201)], got
        )
        self.assertEqual("unknown_instance", data["nodes"][1]["error"]["code"])
        self.assertEqual("registered", data["nodes"][0]["node"]["state"])
        _, listed = await self.call("alice", "GET", "/v1/nodes")
        self.assertEqual({a.uuid for a in mine}, {n["uuid"] for n in listed["nodes"]})
        _, theirs = await self.call("bob", "GET", "/v1/nodes")
        self.assertEqual([], theirs["nodes"])
        # the same batch again: each node is already enrolled, nothing changes
        status, again = await self.call("alice", "POST", "/v1/nodes/batch", body)
        self.assertEqual(200, status, again)
        self.assertEqual(
            ["already_enrolled", "unknown_instance", "already_enrolled"],
            [i["error"]["code"] for i in again["nodes"]],
        )

    async def test_bad_input_is_refused_whole_naming_the_item(self) -> None:
        agent = self.new_agent()
        self.nova.add_server(agent.uuid, self.project_of("alice"))
        bad = dict(self.enrolment(agent.uuid), v="not base64!")
        body = {"nodes": [self.enrolment(agent.uuid), bad]}
        status, data = await self.call("alice", "POST", "/v1/nodes/batch", body)
        self.assertEqual(400, status, data)
        self.assertIn("nodes.1", data["error"]["message"])
        status, data = await self.call(
            "alice", "POST", "/v1/nodes/batch", {"nodes": []}
        )
        self.assertEqual((400, "bad_field"), (status, data["error"]["code"]))
        _, listed = await self.call("alice", "GET", "/v1/nodes")
        self.assertEqual([], listed["nodes"])

    async def test_a_reader_may_not_enrol_a_batch(self) -> None:
        agent = self.new_agent()
        self.nova.add_server(agent.uuid, self.project_of("rita"))
        body = {"nodes": [self.enrolment(agent.uuid)]}
        status, data = await self.call("rita", "POST", "/v1/nodes/batch", body)
        self.assertEqual(403, status, data)
        status, _ = await self.call(None, "POST", "/v1/nodes/batch", body)
        self.assertEqual(401, status)


if __name__ == "__main__":
    unittest.main()
