"""Cross-project attacks on the verifier's API, against a real Keystone.

Each test is one attack from issue 17 ("Why"): a member of project beta
(``bob``) goes after a node, policy or event of project alpha
(``alice``). Each is refused (403 or 404, never a hint that the resource
exists) and leaves alpha's state as it was.
"""

from __future__ import annotations

import uuid as uuid_mod
from typing import Any

from aiohttp.test_utils import TestServer

from verifier.api.authz import Auth
from verifier.api.keystone import KeystoneAuthenticator
from verifier.api.verifier_app import make_app
from verifier.attest.quotas import Quotas
from verifier.exceptions import RequestError
from verifier.policies import make_enforcer
from verifier.tests.functional.tenancy_base import KeystoneTestBase

MB_POLICY = {"secure_boot": True}


class CrossProjectAttackTest(KeystoneTestBase):
    async def alpha_node(self) -> str:
        agent = await self.enrol_node("alice")
        return agent.uuid

    async def assert_unchanged(self, uuid: str, state: str = "registered") -> None:
        status, body = await self.call("alice", "GET", f"/v1/nodes/{uuid}")
        self.assertEqual(200, status, body)
        self.assertEqual(state, body["state"])
        row = self.row(uuid)
        assert row is not None
        self.assertEqual(b"\x01" * 32, row.v_share)
        self.assertEqual([], self.outbox_rows())

    # -- authentication ---------------------------------------------------

    async def test_request_without_token_is_refused(self) -> None:
        status, body = await self.call(None, "GET", "/v1/nodes")
        self.assertEqual(401, status)
        self.assertEqual("unauthorized", body["error"]["code"])

    async def test_forged_token_is_refused(self) -> None:
        status, body = await self.call(None, "GET", "/v1/nodes", token="gAAAAAforged")
        self.assertEqual(401, status)
        self.assertEqual("unauthorized", body["error"]["code"])

    async def test_forged_identity_headers_are_ignored(self) -> None:
        uuid = await self.alpha_node()
        url = str(self.server.make_url(f"/v1/nodes/{uuid}"))
        headers = {
            "X-Auth-Token": self.tokens["bob"],
            "X-Project-Id": self.users["alice"].project_id,
            "X-Roles": "admin,member,reader",
            "X-Identity-Status": "Confirmed",
        }
        async with self.http.get(url, headers=headers) as resp:
            self.assertEqual(404, resp.status)

    # -- nodes ------------------------------------------------------------

    async def test_other_project_cannot_list_node(self) -> None:
        uuid = await self.alpha_node()
        status, body = await self.call("bob", "GET", "/v1/nodes")
        self.assertEqual(200, status)
        self.assertEqual([], body["nodes"])
        status, body = await self.call("alice", "GET", "/v1/nodes")
        self.assertEqual([uuid], [n["uuid"] for n in body["nodes"]])
        self.assertEqual(self.users["alice"].project_id, body["nodes"][0]["project_id"])

    async def test_other_project_cannot_show_node(self) -> None:
        uuid = await self.alpha_node()
        status, body = await self.call("bob", "GET", f"/v1/nodes/{uuid}")
        self.assertEqual(404, status)
        self.assertEqual("unknown_node", body["error"]["code"])

    async def test_other_project_cannot_revoke_node(self) -> None:
        uuid = await self.alpha_node()
        status, body = await self.call("bob", "POST", f"/v1/nodes/{uuid}/revoke", {})
        self.assertEqual(404, status, body)
        await self.assert_unchanged(uuid)

    async def test_other_project_cannot_delete_node(self) -> None:
        uuid = await self.alpha_node()
        status, _ = await self.call("bob", "DELETE", f"/v1/nodes/{uuid}")
        self.assertEqual(404, status)
        await self.assert_unchanged(uuid)

    async def test_other_project_cannot_re_enrol_node_with_its_own_v(self) -> None:
        uuid = await self.alpha_node()
        body = self.enrolment(uuid, v=b"\x02" * 32)
        status, answer = await self.call("bob", "POST", "/v1/nodes", body)
        self.assertEqual(404, status, answer)  # Nova: not bob's instance
        self.assertEqual("unknown_instance", answer["error"]["code"])
        await self.assert_unchanged(uuid)

    async def test_other_project_cannot_read_events(self) -> None:
        uuid = await self.alpha_node()
        status, _ = await self.call("alice", "POST", f"/v1/nodes/{uuid}/revoke", {})
        self.assertEqual(200, status)
        status, body = await self.call("bob", "GET", "/v1/events")
        self.assertEqual((200, []), (status, body["events"]))
        status, body = await self.call("bob", "GET", f"/v1/events?node={uuid}")
        self.assertEqual((200, []), (status, body["events"]))
        status, body = await self.call("alice", "GET", "/v1/events")
        self.assertEqual(1, len(body["events"]))

    async def test_reader_cannot_revoke_own_project_node(self) -> None:
        uuid = await self.alpha_node()
        status, body = await self.call("rita", "POST", f"/v1/nodes/{uuid}/revoke", {})
        self.assertEqual(403, status)
        self.assertEqual("forbidden", body["error"]["code"])
        await self.assert_unchanged(uuid)
        status, _ = await self.call("rita", "GET", f"/v1/nodes/{uuid}")
        self.assertEqual(200, status)

    async def test_other_project_cannot_set_node_policy(self) -> None:
        uuid = await self.alpha_node()
        await self.add_policy("bob")  # bob's own policy, by the same name too
        for body in ({"mb_policy": "golden"}, {"mb_policy": None}):
            status, answer = await self.call(
                "bob", "PUT", f"/v1/nodes/{uuid}/policy", body
            )
            self.assertEqual(404, status, answer)
            self.assertEqual("unknown_node", answer["error"]["code"])
        await self.assert_unchanged(uuid)
        row = self.row(uuid)
        assert row is not None
        self.assertEqual((None, None), (row.mb_policy, row.mb_policy_follow))

    async def test_node_policy_set_to_other_projects_policy_is_404(self) -> None:
        uuid = await self.alpha_node()
        meta = await self.add_policy("bob")
        for ref in ("golden", meta["digest"], "golden@1"):
            status, answer = await self.call(
                "alice", "PUT", f"/v1/nodes/{uuid}/policy", {"mb_policy": ref}
            )
            self.assertEqual(404, status, answer)
            self.assertEqual("unknown_policy", answer["error"]["code"])
            self.assertIn(ref, answer["error"]["message"])
        await self.assert_unchanged(uuid)

    async def test_reader_cannot_set_node_policy(self) -> None:
        uuid = await self.alpha_node()
        await self.add_policy("alice")
        status, body = await self.call(
            "rita", "PUT", f"/v1/nodes/{uuid}/policy", {"mb_policy": "golden"}
        )
        self.assertEqual(403, status)
        self.assertEqual("forbidden", body["error"]["code"])
        await self.assert_unchanged(uuid)
        status, body = await self.call(
            "alice", "PUT", f"/v1/nodes/{uuid}/policy", {"mb_policy": "golden"}
        )
        self.assertEqual(200, status, body)
        in_force = body["policies"]["measured-boot"]
        self.assertEqual(("golden", 1, True), (in_force["name"], in_force["version"],
                                               in_force["follows"]))  # fmt: skip

    async def test_reader_cannot_enrol(self) -> None:
        agent = self.new_agent()
        body = self.enrolment(agent.uuid)
        status, _ = await self.call("rita", "POST", "/v1/nodes", body)
        self.assertEqual(403, status)
        self.assertIsNone(self.row(agent.uuid))

    async def test_member_cannot_read_counters(self) -> None:
        status, _ = await self.call("alice", "GET", "/v1/stats")
        self.assertEqual(403, status)
        status, _ = await self.call("rita", "GET", "/v1/stats")
        self.assertEqual(403, status)

    async def test_observer_reads_counters_and_nothing_else(self) -> None:
        uuid = await self.alpha_node()
        status, body = await self.call("olga", "GET", "/v1/stats")
        self.assertEqual((200, 1), (status, body.get("nodes")), body)
        for path in ("/v1/nodes", f"/v1/nodes/{uuid}", "/v1/events"):
            status, _ = await self.call("olga", "GET", path)
            self.assertEqual(403, status, path)
        status, _ = await self.call("olga", "POST", f"/v1/nodes/{uuid}/revoke", {})
        self.assertEqual(403, status)

    async def test_event_marker_of_another_project_is_a_400(self) -> None:
        uuid = await self.alpha_node()
        status, _ = await self.call("alice", "POST", f"/v1/nodes/{uuid}/revoke", {})
        self.assertEqual(200, status)
        status, body = await self.call("alice", "GET", "/v1/events")
        (event,) = body["events"]
        status, body = await self.call("bob", "GET", f"/v1/events?marker={event['id']}")
        self.assertEqual((400, "bad_field"), (status, body["error"]["code"]))
        self.assertIn("'marker'", body["error"]["message"])
        status, body = await self.call(
            "alice", "GET", f"/v1/events?marker={event['id']}"
        )
        self.assertEqual((200, [], []), (status, body["events"], body["links"]))

    async def test_admin_sees_every_project(self) -> None:
        a = await self.alpha_node()
        b = (await self.enrol_node("bob")).uuid
        status, body = await self.call("admin", "GET", "/v1/nodes")
        self.assertEqual(200, status)
        self.assertEqual(sorted([a, b]), sorted(n["uuid"] for n in body["nodes"]))
        status, _ = await self.call("admin", "GET", f"/v1/nodes/{b}")
        self.assertEqual(200, status)

    # -- policies ---------------------------------------------------------

    async def add_policy(self, who: str, doc: dict[str, Any] = MB_POLICY) -> Any:
        status, body = await self.call(
            who, "POST", "/v1/policies/measured-boot", {"policy": doc, "name": "golden"}
        )
        self.assertEqual(201, status, body)
        return body

    async def test_other_project_cannot_see_policy(self) -> None:
        meta = await self.add_policy("alice")
        status, body = await self.call("bob", "GET", "/v1/policies/measured-boot")
        self.assertEqual((200, []), (status, body["policies"]))
        for ref in ("golden", meta["digest"], "golden@1"):
            status, _ = await self.call(
                "bob", "GET", f"/v1/policies/measured-boot/{ref}"
            )
            self.assertEqual(404, status, ref)

    async def test_other_project_cannot_delete_policy(self) -> None:
        await self.add_policy("alice")
        status, _ = await self.call(
            "bob", "DELETE", "/v1/policies/measured-boot/golden"
        )
        self.assertEqual(404, status)
        status, _ = await self.call("alice", "GET", "/v1/policies/measured-boot/golden")
        self.assertEqual(200, status)

    async def test_other_project_cannot_enrol_with_policy(self) -> None:
        await self.add_policy("alice")
        agent = self.new_agent()
        self.nova.add_server(agent.uuid, self.users["bob"].project_id)
        body = self.enrolment(agent.uuid, mb_policy="golden")
        status, answer = await self.call("bob", "POST", "/v1/nodes", body)
        self.assertEqual(404, status)
        self.assertEqual("unknown_policy", answer["error"]["code"])
        self.assertIsNone(self.row(agent.uuid))

    async def test_policy_content_cannot_be_squatted(self) -> None:
        squatted = await self.add_policy("bob")
        mine = await self.add_policy("alice")
        self.assertEqual(squatted["digest"], mine["digest"])
        self.assertEqual(1, mine["version"])
        status, _ = await self.call(
            "bob", "DELETE", "/v1/policies/measured-boot/golden"
        )
        self.assertEqual(204, status)
        status, _ = await self.call("alice", "GET", "/v1/policies/measured-boot/golden")
        self.assertEqual(200, status)


class InstanceSquattingTest(KeystoneTestBase):
    """``await_instance`` enrolments name instances Nova must show in the
    enrolling project."""

    async def test_other_project_cannot_claim_instance_ahead_of_owner(self) -> None:
        uuid = str(uuid_mod.uuid4())
        self.nova.add_server(uuid, self.users["alice"].project_id)
        body = self.enrolment(uuid, await_instance=True)
        status, answer = await self.call("bob", "POST", "/v1/nodes", body)
        self.assertEqual(404, status, answer)
        self.assertEqual("unknown_instance", answer["error"]["code"])
        self.assertIsNone(self.row(uuid))
        status, answer = await self.call("alice", "POST", "/v1/nodes", body)
        self.assertEqual(201, status, answer)
        self.assertEqual("pending", answer["state"])

    async def test_uuid_nova_does_not_know_cannot_be_claimed(self) -> None:
        uuid = str(uuid_mod.uuid4())
        body = self.enrolment(uuid, await_instance=True)
        status, answer = await self.call("bob", "POST", "/v1/nodes", body)
        self.assertEqual(404, status)
        self.assertEqual("unknown_instance", answer["error"]["code"])
        self.assertIsNone(self.row(uuid))

    async def test_instance_check_fails_closed_without_compute(self) -> None:
        async def no_nova(*args: object) -> None:
            raise RequestError("compute_unavailable", "Nova is down", 503)

        self.instances.require_owned = no_nova  # type: ignore[method-assign]
        uuid = str(uuid_mod.uuid4())
        body = self.enrolment(uuid, await_instance=True)
        status, answer = await self.call("alice", "POST", "/v1/nodes", body)
        self.assertEqual(503, status)
        self.assertIsNone(self.row(uuid))


class QuotaTest(KeystoneTestBase):
    """Per-project quotas: one project at its limit leaves others free."""

    def new_verifier(self, notifiers: Any = None) -> Any:
        verifier = super().new_verifier(notifiers)
        quotas = Quotas(nodes=2, pending_enrolments=1, policies=1, policy_bytes=64)
        verifier.store._quotas = quotas
        verifier.policies._quotas = quotas
        return verifier

    async def test_await_instance_flood_stops_at_pending_quota(self) -> None:
        body: dict[str, Any] = {}
        for i in range(2):
            uuid = str(uuid_mod.uuid4())
            self.nova.add_server(uuid, self.users["bob"].project_id)
            body = self.enrolment(uuid, await_instance=True)
            status, answer = await self.call("bob", "POST", "/v1/nodes", body)
            if i == 0:
                self.assertEqual(201, status, answer)
        self.assertEqual(403, status)
        self.assertEqual("quota_exceeded", answer["error"]["code"])
        self.assertIsNone(self.row(body["uuid"]))
        await self.enrol_node("alice")  # another project is not affected

    async def test_node_quota(self) -> None:
        await self.enrol_node("bob")
        await self.enrol_node("bob")
        agent = self.new_agent()
        self.nova.add_server(agent.uuid, self.users["bob"].project_id)
        status, answer = await self.call(
            "bob", "POST", "/v1/nodes", self.enrolment(agent.uuid)
        )
        self.assertEqual((403, "quota_exceeded"), (status, answer["error"]["code"]))
        self.assertIsNone(self.row(agent.uuid))

    async def test_policy_count_and_bytes_quotas(self) -> None:
        add = {"policy": {"secure_boot": True}, "name": "a"}
        status, _ = await self.call("bob", "POST", "/v1/policies/measured-boot", add)
        self.assertEqual(201, status)
        add["name"] = "b"
        status, answer = await self.call(
            "bob", "POST", "/v1/policies/measured-boot", add
        )
        self.assertEqual((403, "quota_exceeded"), (status, answer["error"]["code"]))
        big = {"policy": {"firmware": ["aa" * 32]}, "name": "big"}
        status, answer = await self.call(
            "alice", "POST", "/v1/policies/measured-boot", big
        )
        self.assertEqual((403, "quota_exceeded"), (status, answer["error"]["code"]))
        self.assertIn("policy bytes", answer["error"]["message"])
        status, body = await self.call("alice", "GET", "/v1/policies/measured-boot")
        self.assertEqual([], body["policies"])


class KeystoneDownTest(KeystoneTestBase):
    async def test_keystone_unreachable_fails_closed(self) -> None:
        conf = self.service_conf(auth_url="http://127.0.0.1:9/v3")
        auth = Auth(make_enforcer(conf), KeystoneAuthenticator(conf))
        server = TestServer(make_app(self.verifier, "PEM", auth), host="127.0.0.1")
        await server.start_server()
        self.addAsyncCleanup(server.close)
        agent = self.new_agent()
        self.nova.add_server(agent.uuid, self.users["alice"].project_id)
        url = str(server.make_url("/v1/nodes"))
        headers = {"X-Auth-Token": self.tokens["alice"]}
        body = self.enrolment(agent.uuid)
        async with self.http.post(url, json=body, headers=headers) as resp:
            self.assertEqual(503, resp.status)
            answer = await resp.json()
        self.assertEqual("auth_unavailable", answer["error"]["code"])
        self.assertIsNone(self.row(agent.uuid))
