"""Policies that follow the node (issue 28): a bare name follows its newest
version, ``name@version`` or a digest pins; a new version switches the
following nodes at their next quote without resetting their IMA replay;
``PUT /v1/nodes/{uuid}/policy`` changes the policies in force; each change
is a signed ``node.policy_changed`` event; the views show the policy in
force. One named test per refused request, each checking nothing changed.

Nodes are fake agents over a SoftTpm whose PCR 10 a SoftKernel extends
exactly as the kernel's IMA would; judging is the real verifier's.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import uuid as uuid_mod
from typing import Any

from aiohttp.test_utils import TestClient, TestServer
from cryptography.hazmat.primitives.asymmetric import ed25519

from trusted_testing.auth import open_auth
from trusted_testing.softkernel import SoftKernel
from verifier.api.verifier_app import make_app
from verifier.attest.ownership import Ownership
from verifier.attest.policies import PolicyStore, follows
from verifier.exceptions import ConflictError, NotFoundError, RequestError
from verifier.protocol import MalformedError, PcrPolicy, RevocationEvent
from verifier.protocol.attestation import AttestationMode
from verifier.protocol.events import (
    NODE_POLICY_CHANGED,
    REVOKING_TYPES,
    PolicyChange,
    SignedEvent,
)
from verifier.protocol.messages.enrolment import PolicyChangeRequest
from verifier.tests.unit.test_attest_runtime import KernelAgent, KernelAgentCase

PROJECT = "noauth"  # the project of open_auth's caller
NEW_FILE = ("/usr/bin/new-tool", b"new tool")
ROGUE_FILE = ("/tmp/rogue", b"rogue")


def _sha256(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


class NoNodes(Ownership):
    """A verifier process that attests none of the nodes."""

    member_id = "other"

    def owns(self, uuid: str) -> bool:
        return False


class PolicyFollowTest(KernelAgentCase):
    """Follow, pin, new versions and the set-policy command."""

    def golden(self, agent: KernelAgent, version: int, *extra: tuple[str, bytes]):
        """The runtime policy ``golden`` at ``version``: what the agent ran
        so far, plus ``extra`` files."""
        doc = self.good_policy(agent) if version == 1 else dict(self._v1)
        doc = json.loads(json.dumps(doc))
        doc["version"] = version
        for path, content in extra:
            doc["digests"][path] = [f"sha256:{_sha256(content)}"]
        if version == 1:
            self._v1 = doc
        return doc

    async def enrol_following(
        self, agent: KernelAgent, ref: str = "golden", project: str = PROJECT
    ) -> Any:
        verifier = self.new_verifier()
        verifier.policies.add("runtime", self.golden(agent, 1), project=project)
        await self.enrol_under(verifier, agent, ref, project=project)
        return verifier

    async def add_version(
        self, verifier: Any, agent: KernelAgent, version: int, *extra: Any
    ) -> str:
        """Add a version as the policy API does: store it, then switch."""
        meta, new = verifier.policies.add(
            "runtime", self.golden(agent, version, *extra), project=PROJECT
        )
        self.assertTrue(new)
        await verifier.switch.new_version("runtime", PROJECT, "golden")
        return str(meta["digest"])

    def policy_events(self) -> list[RevocationEvent]:
        out = []
        for row in self.outbox_rows():
            event = SignedEvent.from_dict(json.loads(row.body)).verify(self.public_key)
            if event.type == NODE_POLICY_CHANGED:
                out.append(event)
        return out

    # -- follow and pin -----------------------------------------------------------

    def test_bare_name_follows_and_version_or_digest_pins(self) -> None:
        self.assertEqual("web", follows("web"))
        self.assertIsNone(follows("web@4"))
        self.assertIsNone(follows("ab" * 32))
        self.assertEqual("AB" * 32, follows("AB" * 32))  # not a digest: a name

    async def test_following_node_switches_to_new_version_and_keeps_replay(
        self,
    ) -> None:
        agent = self.new_kernel_agent()
        verifier = await self.enrol_following(agent)
        view = await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual("attested", view.state)
        replayed = view.ima_entries
        v2 = await self.add_version(verifier, agent, 2, NEW_FILE)
        node = verifier.nodes.live(agent.uuid)
        self.assertEqual(v2, node.runtime_ref)
        self.assertEqual(replayed, node.ima.count)  # not reset
        agent.kernel.measure(*NEW_FILE)  # allowed by version 2 only
        view = await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual("attested", view.state, view.failure_reason)
        self.assertEqual(str(replayed), agent.quote_requests[-1]["ima_from"])
        self.assertEqual(replayed + 1, view.ima_entries)
        row = self.row(agent.uuid)
        assert row is not None
        self.assertEqual(
            (v2, "golden"), (row.runtime_policy, row.runtime_policy_follow)
        )
        (event,) = self.policy_events()
        self.assertEqual(("follow", agent.uuid), (event.reason, event.node_uuid))
        change = PolicyChange.from_detail(event.detail)
        assert change.old is not None and change.new is not None
        self.assertEqual(("runtime", 1, 2), (change.kind, change.old["version"],
                                             change.new["version"]))  # fmt: skip
        self.assertEqual(v2, change.new["digest"])

    async def test_file_allowed_by_neither_version_fails_with_unknown_file(
        self,
    ) -> None:
        agent = self.new_kernel_agent()
        verifier = await self.enrol_following(agent)
        await verifier.rounds.attest_once(agent.uuid)
        await self.add_version(verifier, agent, 2, NEW_FILE)
        agent.kernel.measure(*ROGUE_FILE)
        view = await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual("revoked", view.state)
        self.assertIn("unknown_file", view.failure_reason or "")
        self.assertIn(ROGUE_FILE[0], view.failure_reason or "")

    async def test_pinned_node_keeps_its_version(self) -> None:
        agent = self.new_kernel_agent()
        verifier = await self.enrol_following(agent, ref="golden@1")
        await verifier.rounds.attest_once(agent.uuid)
        v1 = verifier.nodes.live(agent.uuid).runtime_ref
        await self.add_version(verifier, agent, 2, NEW_FILE)
        self.assertEqual(v1, verifier.nodes.live(agent.uuid).runtime_ref)
        self.assertEqual([], self.policy_events())
        agent.kernel.measure(*NEW_FILE)  # version 1 does not allow it
        view = await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual("revoked", view.state)
        self.assertIn("unknown_file", view.failure_reason or "")

    async def test_older_version_added_later_switches_nothing(self) -> None:
        agent = self.new_kernel_agent()
        verifier = await self.enrol_following(agent)
        v3 = await self.add_version(verifier, agent, 3, NEW_FILE)
        await self.add_version(verifier, agent, 2)  # below the newest
        self.assertEqual(v3, verifier.nodes.live(agent.uuid).runtime_ref)
        self.assertEqual(1, len(self.policy_events()))

    async def test_two_versions_added_at_once_leave_the_node_on_the_newer(
        self,
    ) -> None:
        agent = self.new_kernel_agent()
        verifier = await self.enrol_following(agent)
        for version in (2, 3):
            verifier.policies.add(
                "runtime", self.golden(agent, version, NEW_FILE), project=PROJECT
            )
        switched = await asyncio.gather(
            verifier.switch.new_version("runtime", PROJECT, "golden"),
            verifier.switch.new_version("runtime", PROJECT, "golden"),
        )
        self.assertEqual([0, 1], sorted(switched))
        v3 = self.row_digest_of(verifier, "golden@3")
        self.assertEqual(v3, verifier.nodes.live(agent.uuid).runtime_ref)
        row = self.row(agent.uuid)
        assert row is not None
        self.assertEqual(v3, row.runtime_policy)
        (event,) = self.policy_events()
        change = PolicyChange.from_detail(event.detail)
        assert change.new is not None
        self.assertEqual(3, change.new["version"])

    async def test_other_projects_version_of_the_same_name_switches_nothing(
        self,
    ) -> None:
        agent = self.new_kernel_agent()
        verifier = await self.enrol_following(agent)
        v1 = verifier.nodes.live(agent.uuid).runtime_ref
        verifier.policies.add(
            "runtime", self.golden(agent, 2, NEW_FILE), project="beta"
        )
        self.assertEqual(
            0, await verifier.switch.new_version("runtime", "beta", "golden")
        )
        self.assertEqual(v1, verifier.nodes.live(agent.uuid).runtime_ref)
        self.assertEqual([], self.policy_events())

    async def test_node_enrolled_ahead_of_its_instance_follows_too(self) -> None:
        agent = self.new_kernel_agent()
        verifier = self.new_verifier()
        self.quiesce(verifier)
        verifier.policies.add("runtime", self.golden(agent, 1), project=PROJECT)
        await verifier.commands.enrol(
            agent.uuid,
            os.urandom(32),
            PcrPolicy({}),
            runtime_policy="golden",
            await_instance=True,
            project=PROJECT,
        )
        v2 = await self.add_version(verifier, agent, 2, NEW_FILE)
        row = self.row(agent.uuid)
        assert row is not None
        self.assertEqual(("pending", v2), (row.state, row.runtime_policy))

    async def test_push_node_follows_a_new_version(self) -> None:
        agent = self.new_kernel_agent()
        verifier = self.new_verifier()
        verifier.policies.add("runtime", self.golden(agent, 1), project=PROJECT)
        await self.enrol_under(
            verifier, agent, "golden", project=PROJECT, mode=AttestationMode.PUSH
        )
        v2 = await self.add_version(verifier, agent, 2, NEW_FILE)
        node = verifier.nodes.live(agent.uuid)
        self.assertEqual(v2, node.runtime_ref)
        self.assertIs(node.runtime, verifier.policies.cached(v2))  # judged with it

    async def test_another_verifier_process_takes_the_change_at_its_sync(
        self,
    ) -> None:
        agent = self.new_kernel_agent()
        owner = await self.enrol_following(agent)
        await owner.rounds.attest_once(agent.uuid)
        other = self.new_verifier_owning_nothing()
        meta, _ = other.policies.add(
            "runtime", self.golden(agent, 2, NEW_FILE), project=PROJECT
        )
        self.assertEqual(
            1, await other.switch.new_version("runtime", PROJECT, "golden")
        )
        node = owner.nodes.live(agent.uuid)
        self.assertNotEqual(meta["digest"], node.runtime_ref)  # not yet
        count = node.ima.count
        await owner.sync.sync()
        self.assertEqual(meta["digest"], node.runtime_ref)
        self.assertEqual(count, node.ima.count)
        agent.kernel.measure(*NEW_FILE)
        view = await owner.rounds.attest_once(agent.uuid)
        self.assertEqual("attested", view.state, view.failure_reason)

    async def test_policy_set_through_another_verifier_process_reaches_the_owner(
        self,
    ) -> None:
        agent = self.new_kernel_agent()
        owner = await self.enrol_following(agent)
        await owner.rounds.attest_once(agent.uuid)
        other = self.new_verifier_owning_nothing()
        other.policies.add(
            "measured-boot", SoftKernel.golden_mb_policy(), name="fw", project=PROJECT
        )
        change = PolicyChangeRequest({"runtime_policy": "golden@1", "mb_policy": "fw"})
        view = await other.commands.set_policy(agent.uuid, change, PROJECT)
        self.assertEqual(["runtime", "measured-boot"], list(view.in_force()))
        node = owner.nodes.live(agent.uuid)
        self.assertIsNone(node.mb_ref)  # not yet
        await owner.sync.sync()
        self.assertEqual((view.runtime_policy, view.mb_policy),
                         (node.runtime_ref, node.mb_ref))  # fmt: skip
        self.assertEqual((None, "fw"), node.follows)
        view = await owner.rounds.attest_once(agent.uuid)
        self.assertEqual("attested", view.state, view.failure_reason)
        self.assertEqual("1", agent.quote_requests[-1]["mb"])  # judged with it

    def new_verifier_owning_nothing(self) -> Any:
        return self.new_verifier(ownership=NoNodes())

    # -- set-policy -----------------------------------------------------------------

    async def test_set_policy_pins_then_follows_again(self) -> None:
        agent = self.new_kernel_agent()
        verifier = await self.enrol_following(agent)
        await verifier.rounds.attest_once(agent.uuid)
        v2 = await self.add_version(verifier, agent, 2, NEW_FILE)
        v1 = self.row_digest_of(verifier, "golden@1")
        change = PolicyChangeRequest({"runtime_policy": "golden@1"})
        view = await verifier.commands.set_policy(agent.uuid, change, PROJECT)
        runtime = view.in_force()["runtime"]
        assert runtime is not None
        self.assertEqual((v1, 1, False), (runtime["digest"], runtime["version"],
                                          runtime["follows"]))  # fmt: skip
        await self.add_version(verifier, agent, 3, NEW_FILE)
        self.assertEqual(v1, verifier.nodes.live(agent.uuid).runtime_ref)  # pinned
        change = PolicyChangeRequest({"runtime_policy": "golden"})
        view = await verifier.commands.set_policy(agent.uuid, change, PROJECT)
        runtime = view.in_force()["runtime"]
        assert runtime is not None
        self.assertEqual((3, True), (runtime["version"], runtime["follows"]))
        reasons = [(e.reason, PolicyChange.from_detail(e.detail)) for e in
                   self.policy_events()]  # fmt: skip
        got = [(r, c.old and c.old["version"], c.new and c.new["version"])
               for r, c in reasons]  # fmt: skip
        self.assertEqual(
            sorted([("follow", 1, 2), ("set", 2, 1), ("set", 1, 3)]), sorted(got)
        )
        self.assertNotEqual(v2, verifier.nodes.live(agent.uuid).runtime_ref)

    def row_digest_of(self, verifier: Any, ref: str) -> str:
        return str(verifier.policies.resolve("runtime", ref, PROJECT))

    async def test_set_policy_adds_measured_boot_and_drops_runtime(self) -> None:
        agent = self.new_kernel_agent()
        verifier = await self.enrol_following(agent)
        await verifier.rounds.attest_once(agent.uuid)
        verifier.policies.add(
            "measured-boot", SoftKernel.golden_mb_policy(), name="fw", project=PROJECT
        )
        change = PolicyChangeRequest({"runtime_policy": None, "mb_policy": "fw"})
        view = await verifier.commands.set_policy(agent.uuid, change, PROJECT)
        self.assertIsNone(view.runtime_policy)
        mb = view.in_force()["measured-boot"]
        assert mb is not None
        self.assertEqual(("fw", True), (mb["name"], mb["follows"]))
        view = await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual("attested", view.state, view.failure_reason)
        self.assertEqual("1", agent.quote_requests[-1]["mb"])  # checked at once
        self.assertNotIn("ima_from", agent.quote_requests[-1])

    async def test_policy_set_while_a_quote_is_in_flight_asks_again(self) -> None:
        agent = self.new_kernel_agent()
        verifier = self.new_verifier()
        verifier.policies.add("runtime", self.golden(agent, 1), project=PROJECT)
        await verifier.commands.enrol(
            agent.uuid, os.urandom(32), self.policy_of(agent), project=PROJECT
        )
        self.quiesce(verifier)
        await verifier.rounds.attest_once(agent.uuid)
        digest = self.row_digest_of(verifier, "golden")
        node = verifier.nodes.live(agent.uuid)
        # the runtime policy arrives while the agent answers a quote asked
        # for without IMA entries
        agent.answer_hook = lambda answer: node.use(
            (digest, None), ("golden", None), verifier.policies.load
        )
        view = await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual("attested", view.state, view.failure_reason)
        self.assertNotIn("ima_from", agent.quote_requests[-2])
        self.assertEqual("0", agent.quote_requests[-1]["ima_from"])

    def policy_of(self, agent: KernelAgent) -> PcrPolicy:
        return PcrPolicy({16: frozenset({agent.tpm.pcrs[16]})})

    # -- refused requests: nothing changes ---------------------------------------------

    async def assert_nothing_changed(self, verifier: Any, uuid: str) -> None:
        row = self.row(uuid)
        assert row is not None
        self.assertEqual(self._row_before, (row.runtime_policy, row.mb_policy,
                                            row.runtime_policy_follow))  # fmt: skip
        self.assertEqual([], self.policy_events())
        self.assertEqual(self._row_before[0], verifier.nodes.live(uuid).runtime_ref)

    async def refused_setup(self) -> tuple[Any, KernelAgent]:
        agent = self.new_kernel_agent()
        verifier = await self.enrol_following(agent)
        row = self.row(agent.uuid)
        assert row is not None
        self._row_before = (
            row.runtime_policy,
            row.mb_policy,
            row.runtime_policy_follow,
        )
        return verifier, agent

    async def test_set_policy_of_other_projects_node_is_404_as_missing(self) -> None:
        verifier, agent = await self.refused_setup()
        verifier.policies.add(
            "runtime", self.golden(agent, 2, NEW_FILE), project="beta"
        )
        change = PolicyChangeRequest({"runtime_policy": "golden"})
        with self.assertRaises(NotFoundError) as caught:
            await verifier.commands.set_policy(agent.uuid, change, "beta")
        self.assertEqual("unknown_node", caught.exception.code)
        with self.assertRaises(NotFoundError) as missing:
            await verifier.commands.set_policy(str(uuid_mod.uuid4()), change, "beta")
        self.assertEqual(missing.exception.code, caught.exception.code)
        await self.assert_nothing_changed(verifier, agent.uuid)

    async def test_set_policy_unknown_version_is_404_naming_it(self) -> None:
        verifier, agent = await self.refused_setup()
        change = PolicyChangeRequest({"runtime_policy": "golden@9"})
        with self.assertRaises(NotFoundError) as caught:
            await verifier.commands.set_policy(agent.uuid, change, PROJECT)
        self.assertEqual("unknown_policy", caught.exception.code)
        self.assertIn("golden@9", str(caught.exception))
        await self.assert_nothing_changed(verifier, agent.uuid)

    async def test_set_policy_other_projects_policy_is_404(self) -> None:
        verifier, agent = await self.refused_setup()
        meta, _ = verifier.policies.add(
            "measured-boot", SoftKernel.golden_mb_policy(), name="fw", project="beta"
        )
        for ref in ("fw", meta["digest"]):
            change = PolicyChangeRequest({"mb_policy": ref})
            with self.assertRaises(NotFoundError):
                await verifier.commands.set_policy(agent.uuid, change, PROJECT)
        await self.assert_nothing_changed(verifier, agent.uuid)

    async def test_set_policy_that_leaves_nothing_to_check_is_refused(self) -> None:
        verifier, agent = await self.refused_setup()
        change = PolicyChangeRequest({"runtime_policy": None})
        with self.assertRaises(RequestError) as caught:
            await verifier.commands.set_policy(agent.uuid, change, PROJECT)
        self.assertEqual("no_policy", caught.exception.code)
        await self.assert_nothing_changed(verifier, agent.uuid)

    async def test_set_policy_of_revoked_node_is_refused(self) -> None:
        verifier, agent = await self.refused_setup()
        await verifier.commands.revoke(agent.uuid, "tenant_revoked", "test", PROJECT)
        change = PolicyChangeRequest({"runtime_policy": "golden@1"})
        with self.assertRaises(ConflictError):
            await verifier.commands.set_policy(agent.uuid, change, PROJECT)
        await self.assert_nothing_changed(verifier, agent.uuid)

    async def test_unsigned_version_where_signing_required_is_400_and_switches_nothing(
        self,
    ) -> None:
        verifier, agent = await self.refused_setup()
        key = ed25519.Ed25519PrivateKey.generate()
        signed_only = PolicyStore(self.engine, [key.public_key()])
        with self.assertRaises(RequestError) as caught:
            signed_only.add("runtime", self.golden(agent, 2, NEW_FILE), project=PROJECT)
        self.assertEqual(("policy_signature", 400),
                         (caught.exception.code, caught.exception.status))  # fmt: skip
        self.assertEqual(
            0, await verifier.switch.new_version("runtime", PROJECT, "golden")
        )
        await self.assert_nothing_changed(verifier, agent.uuid)

    def test_bad_policy_change_bodies_are_refused_naming_the_field(self) -> None:
        for body, field in (
            ({}, "runtime_policy"),
            ({"runtime_policy": 5}, "runtime_policy"),
            ({"mb_policy": "x" * 300}, "mb_policy"),
            ({"runtime": "web"}, "runtime"),
            ([], None),
            ("web", None),
        ):
            with self.subTest(body=body), self.assertRaises(MalformedError) as caught:
                PolicyChangeRequest.from_dict(body)
            if field is not None:
                self.assertIn(field, str(caught.exception))
        parsed = PolicyChangeRequest.from_dict({"mb_policy": None})
        self.assertEqual({"measured-boot": None}, parsed.refs())

    # -- the API ---------------------------------------------------------------------

    async def test_api_set_policy_and_new_version_through_the_policy_api(self) -> None:
        agent = self.new_kernel_agent()
        verifier = await self.enrol_following(agent)
        app = make_app(verifier, "PEM", open_auth())
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            url = f"/v1/nodes/{agent.uuid}"
            body = await (await client.get(url)).json()
            self.assertEqual(
                {"name": "golden", "version": 1, "follows": True},
                {k: body["policies"]["runtime"][k] for k in ("name", "version",
                                                            "follows")},
            )  # fmt: skip
            self.assertIsNone(body["policies"]["measured-boot"])
            upload = {"policy": self.golden(agent, 2, NEW_FILE)}
            resp = await client.post("/v1/policies/runtime", json=upload)
            self.assertEqual(201, resp.status, await resp.text())
            body = await (await client.get(url)).json()
            self.assertEqual(2, body["policies"]["runtime"]["version"])
            listed = await (await client.get("/v1/nodes")).json()
            self.assertEqual(2, listed["nodes"][0]["policies"]["runtime"]["version"])
            for bad, status, code in (
                ({}, 400, "bad_field"),
                ({"runtime_policy": ["web"]}, 400, "bad_field"),
                ({"runtime_policy": "web", "pcrs": [1]}, 400, "bad_field"),
                ({"runtime_policy": "golden@7"}, 404, "unknown_policy"),
                ({"runtime_policy": "golden@x"}, 400, "bad_field"),
            ):
                resp = await client.put(f"{url}/policy", json=bad)
                answer = await resp.json()
                self.assertEqual(status, resp.status, answer)
                self.assertEqual(code, answer["error"]["code"], answer)
            resp = await client.put(f"{url}/policy", data=b"{not json")
            self.assertEqual(400, resp.status)
            resp = await client.put(
                f"/v1/nodes/{uuid_mod.uuid4()}/policy", json={"runtime_policy": "x"}
            )
            self.assertEqual(404, resp.status)
            self.assertEqual("unknown_node", (await resp.json())["error"]["code"])
            resp = await client.put(
                f"{url}/policy", json={"runtime_policy": "golden@1"}
            )
            body = await resp.json()
            self.assertEqual(200, resp.status, body)
            self.assertEqual(1, body["policies"]["runtime"]["version"])
            self.assertFalse(body["policies"]["runtime"]["follows"])

    # -- the event ---------------------------------------------------------------------

    def test_policy_changed_event_is_not_revoking(self) -> None:
        # the key service bumps no epoch and capabilities count no epoch
        # for it (REVOKING_TYPES); the hooks run no action (their tests)
        self.assertNotIn(NODE_POLICY_CHANGED, REVOKING_TYPES)

    def test_policy_change_detail_refuses_bad_input(self) -> None:
        for detail in ("", "[]", '{"kind":"x","from":null,"to":null}',
                       '{"kind":"runtime","from":{"name":1},"to":null}',
                       '{"kind":"runtime","from":null}'):  # fmt: skip
            with self.subTest(detail=detail), self.assertRaises(MalformedError):
                PolicyChange.from_detail(detail)
