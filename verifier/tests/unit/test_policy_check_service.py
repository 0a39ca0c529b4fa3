"""The dry run of a runtime policy in the verifier service and its API
(``POST /v1/policies/runtime/{ref}/check``, and of a document not stored:
``POST /v1/policies/runtime/check``): live lists fetched from the
nodes' agents (fake agents answering with real quotes of a SoftTpm driven
by a SoftKernel), judged against the candidate; the caller's project only;
nothing about any node changes; every bad input a named JSON 4xx.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import types
import uuid as uuid_mod
from dataclasses import astuple
from typing import Any

from aiohttp.test_utils import TestClient, TestServer
from keystoneauth1 import session as ks_session
from osc_lib import exceptions as osc_exceptions

from nova_plugin.attestation import AttestationClient
from nova_plugin.osc_attestation import CheckPolicy
from trusted_testing.auth import open_auth
from verifier.api.verifier_app import make_app, public_pem
from verifier.attest.policies import canonical
from verifier.attest.service import Verifier
from verifier.exceptions import NotFoundError
from verifier.protocol.attestation import AttestationMode
from verifier.protocol.ima import parse_ascii, policy_from_log
from verifier.protocol.messages.policy_check import (
    MAX_CHECK_NODES,
    CheckResult,
    PolicyCheckReport,
    PolicyCheckRequest,
)
from verifier.tests.unit.test_attest_runtime import KernelAgent, KernelAgentCase

PROJECT = "noauth"  # the open caller's project (trusted_testing.auth)
OTHER = "someone-else"


class PolicyCheckBase(KernelAgentCase):
    def new_kernel_agent(self) -> KernelAgent:
        """A node that ran python3."""
        agent = super().new_kernel_agent()
        agent.kernel.measure("/usr/bin/python3", b"py")
        return agent

    @staticmethod
    def list_policy(agent: KernelAgent, version: int) -> dict[str, Any]:
        with open(agent.kernel.ima_path, encoding="utf-8") as f:
            return policy_from_log(parse_ascii(f.read()), "web", version).to_dict()

    async def enrolled(
        self, verifier: Verifier, agent: KernelAgent, project: str = PROJECT
    ) -> None:
        await self.enrol_under(verifier, agent, "web", project=project)
        view = await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual("attested", view.state, view)

    def snapshot(self, verifier: Verifier, uuid: str) -> tuple[Any, ...]:
        """Everything a check must not change about a node."""
        node = verifier.nodes.find(uuid)
        row = self.row(uuid)
        assert node is not None and row is not None
        return (
            node.state,
            node.ima,
            node.clock,
            node.quotes_verified,
            node.last_attested_at,
            node.unreachable,
            node.dirty,
            row.state,
            row.ima_count,
            row.ima_pcr,
            row.clock,
            row.quotes_verified,
            row.updated_at,
            len(self.outbox_rows()),
        )


class PolicyCheckServiceTest(PolicyCheckBase):
    async def fleet(self) -> tuple[Verifier, KernelAgent, KernelAgent]:
        """Two attested nodes under web@1; web@2 is a candidate made from
        the first node's list before it ran one more file."""
        verifier = self.new_verifier()
        good, patched = self.new_kernel_agent(), self.new_kernel_agent()
        verifier.policies.add("runtime", self.list_policy(good, 1), project=PROJECT)
        await self.enrolled(verifier, good)
        await self.enrolled(verifier, patched)
        verifier.policies.add("runtime", self.list_policy(good, 2), project=PROJECT)
        return verifier, good, patched

    async def test_check_lists_what_the_candidate_lacks_and_changes_nothing(
        self,
    ) -> None:
        verifier, good, patched = await self.fleet()
        patched.kernel.measure("/usr/bin/new-tool", b"v2")
        before = {a.uuid: self.snapshot(verifier, a.uuid) for a in (good, patched)}
        asked = len(patched.quote_requests)
        report = await verifier.checker.check(
            "web@2", PROJECT, PolicyCheckRequest((good.uuid, patched.uuid))
        )
        self.assertEqual(("web", 2), (report.policy.name, report.policy.version))
        first, second = report.results
        self.assertEqual(
            (good.uuid, CheckResult.PASS, 2), (first.node, first.result, first.entries)
        )
        self.assertEqual(CheckResult.FAIL, second.result)
        self.assertEqual(
            [(2, "/usr/bin/new-tool", "unknown_file")],
            [(f.index, f.path, f.reason) for f in second.failures],
        )
        request = patched.quote_requests[asked]
        self.assertEqual("0", request["ima_from"])  # the whole list
        self.assertEqual("0", request["csr"])
        for agent in (good, patched):
            self.assertEqual(before[agent.uuid], self.snapshot(verifier, agent.uuid))
        # the node's next real round continues where it was
        view = await verifier.rounds.attest_once(patched.uuid)
        self.assertEqual("revoked", view.state)  # web@1 lacks new-tool
        self.assertEqual("2", patched.quote_requests[-1]["ima_from"])

    async def test_all_checks_the_project_s_nodes_but_revoked_ones(self) -> None:
        verifier, good, patched = await self.fleet()
        foreign = self.new_kernel_agent()
        verifier.policies.add("runtime", self.list_policy(foreign, 1), project=OTHER)
        await self.enrolled(verifier, foreign, project=OTHER)
        await verifier.commands.revoke(patched.uuid, "tenant_revoked", "test", PROJECT)
        report = await verifier.checker.check(
            "web", PROJECT, PolicyCheckRequest(all=True)
        )
        self.assertEqual([good.uuid], [r.node for r in report.results])
        self.assertEqual(2, report.policy.version)  # a bare name: the newest
        self.assertEqual([], foreign.quote_requests[1:])  # never asked

    async def test_explicit_revoked_node_is_an_error(self) -> None:
        verifier, good, patched = await self.fleet()
        await verifier.commands.revoke(patched.uuid, "tenant_revoked", "test", PROJECT)
        report = await verifier.checker.check(
            "web@1", PROJECT, PolicyCheckRequest((patched.uuid,))
        )
        self.assertEqual("node_revoked", report.results[0].reason)

    async def test_another_project_s_node_is_unknown(self) -> None:
        verifier, good, _ = await self.fleet()
        foreign = self.new_kernel_agent()
        verifier.policies.add("runtime", self.list_policy(foreign, 1), project=OTHER)
        await self.enrolled(verifier, foreign, project=OTHER)
        for uuid in (foreign.uuid, str(uuid_mod.uuid4())):
            with self.assertRaises(NotFoundError) as ctx:
                await verifier.checker.check(
                    "web", PROJECT, PolicyCheckRequest((good.uuid, uuid))
                )
            self.assertEqual("unknown_node", ctx.exception.code)
            self.assertIn(uuid, ctx.exception.detail)
        self.assertEqual(1, len(foreign.quote_requests))  # its enrolment only

    async def test_another_project_s_policy_is_unknown(self) -> None:
        verifier, good, _ = await self.fleet()
        verifier.policies.add(
            "runtime", {"name": "theirs", "version": 1}, project=OTHER
        )
        for ref in ("theirs", "web@9", "0" * 64):
            with self.assertRaises(NotFoundError) as ctx:
                await verifier.checker.check(
                    ref, PROJECT, PolicyCheckRequest((good.uuid,))
                )
            self.assertEqual("unknown_policy", ctx.exception.code)
            self.assertIn(ref, ctx.exception.detail)

    async def test_unreachable_agent_is_an_error_and_not_counted(self) -> None:
        verifier, good, _ = await self.fleet()
        before = self.snapshot(verifier, good.uuid)
        good.unreachable = True
        report = await verifier.checker.check(
            "web", PROJECT, PolicyCheckRequest((good.uuid,))
        )
        self.assertEqual("agent_unreachable", report.results[0].reason)
        self.assertEqual(before, self.snapshot(verifier, good.uuid))

    async def test_forged_answer_is_an_error_and_does_not_revoke(self) -> None:
        verifier, good, _ = await self.fleet()
        good.kernel.log_only("/usr/bin/python3", b"py")  # not extended
        good.kernel.measure("/tmp/miner", b"m")
        lines = open(good.kernel.ima_path, encoding="utf-8").read().splitlines(True)
        with open(good.kernel.ima_path, "w", encoding="utf-8") as f:
            f.write("".join(lines[:-1]))  # hides the miner: does not replay
        before = self.snapshot(verifier, good.uuid)
        report = await verifier.checker.check(
            "web", PROJECT, PolicyCheckRequest((good.uuid,))
        )
        self.assertEqual(CheckResult.ERROR, report.results[0].result)
        self.assertEqual("ima_pcr_mismatch", report.results[0].reason)
        self.assertEqual(before, self.snapshot(verifier, good.uuid))

    async def test_push_node_is_not_fetchable(self) -> None:
        verifier = self.new_verifier()
        agent = self.new_kernel_agent()
        verifier.policies.add("runtime", self.list_policy(agent, 1), project=PROJECT)
        await self.enrol_under(
            verifier, agent, "web", project=PROJECT, mode=AttestationMode.PUSH
        )
        report = await verifier.checker.check(
            "web", PROJECT, PolicyCheckRequest((agent.uuid,))
        )
        self.assertEqual("push_mode_not_fetchable", report.results[0].reason)
        self.assertEqual([], agent.quote_requests)

    async def test_nodes_are_checked_at_most_n_at_a_time_each_bounded(self) -> None:
        verifier, good, patched = await self.fleet()
        agents = [self.new_kernel_agent() for _ in range(4)]
        for agent in agents:
            await self.enrolled(verifier, agent)
        running, peak = 0, 0

        async def slow() -> None:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            await asyncio.sleep(0.02)
            running -= 1

        for agent in (good, patched, *agents):
            agent.before_answer = slow
        checker = type(verifier.checker)(
            verifier.store, verifier.nodes, verifier.policies, self.agents,  # type: ignore[arg-type]
            concurrency=2,
        )  # fmt: skip
        report = await checker.check("web", PROJECT, PolicyCheckRequest(all=True))
        self.assertEqual(6, len(report.results))
        self.assertEqual(2, peak)

        async def stuck() -> None:
            await asyncio.sleep(5)

        good.before_answer = stuck
        checker = type(verifier.checker)(
            verifier.store, verifier.nodes, verifier.policies, self.agents,  # type: ignore[arg-type]
            node_timeout=0.1,
        )  # fmt: skip
        report = await checker.check("web", PROJECT, PolicyCheckRequest((good.uuid,)))
        self.assertEqual("timeout", report.results[0].reason)


class PolicyCheckApiTest(PolicyCheckBase):
    async def call(self, verifier: Verifier, path: str, body: bytes) -> tuple[int, Any]:
        app = make_app(verifier, public_pem(self.public_key), open_auth())
        async with TestClient(TestServer(app)) as client:
            headers = {"Content-Type": "application/json"}
            resp = await client.post(path, data=body, headers=headers)
            return resp.status, await resp.json()

    async def setup_node(self) -> tuple[Verifier, KernelAgent]:
        verifier = self.new_verifier()
        agent = self.new_kernel_agent()
        verifier.policies.add("runtime", self.list_policy(agent, 1), project=PROJECT)
        await self.enrolled(verifier, agent)
        return verifier, agent

    async def test_check_answers_the_report(self) -> None:
        verifier, agent = await self.setup_node()
        agent.kernel.measure("/usr/bin/unknown", b"u")
        body = json.dumps({"nodes": [agent.uuid.upper()]}).encode()
        status, data = await self.call(
            verifier, "/v1/policies/runtime/web@1/check", body
        )
        self.assertEqual(200, status, data)
        report = PolicyCheckReport.from_dict(data)
        self.assertEqual(agent.uuid, report.results[0].node)
        self.assertEqual("fail", data["results"][0]["result"])
        self.assertEqual(
            {"index": 2, "path": "/usr/bin/unknown", "reason": "unknown_file"},
            {
                k: data["results"][0]["failures"][0][k]
                for k in ("index", "path", "reason")
            },
        )
        self.assertEqual({"name", "version", "digest"}, set(data["policy"]))

    async def test_bad_input_is_a_named_4xx(self) -> None:
        verifier, agent = await self.setup_node()
        path = "/v1/policies/runtime/web/check"
        many = [str(uuid_mod.uuid4()) for _ in range(MAX_CHECK_NODES + 1)]
        cases = {
            "neither nodes nor all": (b"{}", 400, "bad_field", "'nodes'"),
            "both": (
                json.dumps({"nodes": [agent.uuid], "all": True}).encode(),
                400, "bad_field", "not both",
            ),
            "all false": (b'{"all": false}', 400, "bad_field", "'nodes'"),
            "empty list": (b'{"nodes": []}', 400, "bad_field", "'nodes'"),
            "too many": (json.dumps({"nodes": many}).encode(), 400, "bad_field",
                         f"at most {MAX_CHECK_NODES}"),
            "not a uuid": (b'{"nodes": ["web-1"]}', 400, "malformed", "web-1"),
            "nodes not a list": (b'{"nodes": "x"}', 400, "bad_field", "'nodes'"),
            "all not a bool": (b'{"all": 1}', 400, "bad_field", "'all'"),
            "unknown field": (b'{"all": true, "node": 1}', 400, "bad_field", "'node'"),
            "not json": (b"{", 400, "bad_json", ""),
            "not an object": (b"[]", 400, "bad_json", ""),
        }  # fmt: skip
        for name, (body, status, code, words) in cases.items():
            with self.subTest(name):
                got, data = await self.call(verifier, path, body)
                self.assertEqual(status, got, data)
                self.assertEqual(code, data["error"]["code"], data)
                self.assertIn(words, data["error"]["message"])
        status, data = await self.call(
            verifier, "/v1/policies/runtime/web@7/check", b'{"all": true}'
        )
        self.assertEqual((404, "unknown_policy"), (status, data["error"]["code"]))
        self.assertIn("web@7", data["error"]["message"])
        status, data = await self.call(
            verifier, "/v1/policies/runtime/web@x/check", b'{"all": true}'
        )
        self.assertEqual((400, "bad_field"), (status, data["error"]["code"]))
        unknown = str(uuid_mod.uuid4())
        status, data = await self.call(
            verifier, path, json.dumps({"nodes": [unknown]}).encode()
        )
        self.assertEqual((404, "unknown_node"), (status, data["error"]["code"]))
        self.assertIn(unknown, data["error"]["message"])
        # nothing stored was lost or changed by the refusals
        self.assertEqual(1, len(verifier.policies.list("runtime", PROJECT)))
        self.assertEqual("attested", self.row(agent.uuid).state)  # type: ignore[union-attr]


class OpenStackPolicyCheckTest(PolicyCheckBase):
    """``openstack attestation policy check`` (the OSC plugin's command)
    on an AttestationClient over a keystoneauth session, against the real
    verifier application: the table and the exit status."""

    async def test_table_and_exit_status(self) -> None:
        verifier = self.new_verifier()
        good, patched = self.new_kernel_agent(), self.new_kernel_agent()
        verifier.policies.add("runtime", self.list_policy(good, 1), project=PROJECT)
        await self.enrolled(verifier, good)
        await self.enrolled(verifier, patched)
        patched.kernel.measure("/usr/bin/new-tool", b"v2")  # allowed by none
        verifier.policies.add("runtime", self.list_policy(patched, 2), project=PROJECT)
        app = make_app(verifier, public_pem(self.public_key), open_auth())
        async with TestServer(app) as server:
            client = AttestationClient(
                ks_session.Session(),
                endpoint_override=str(server.make_url("")).rstrip("/"),
            )
            out = io.StringIO()
            shell = types.SimpleNamespace(
                stdout=out, client_manager=types.SimpleNamespace(attestation=client)
            )
            command = CheckPolicy(shell, None)
            parser = command.get_parser("openstack attestation policy check")

            def run(*argv: str) -> int:
                return command.run(parser.parse_args(list(argv)))

            self.assertEqual(1, await asyncio.to_thread(run, "web@1", "--all"))
            table = out.getvalue()
            self.assertIn("2 /usr/bin/new-tool: unknown_file", table)
            self.assertIn(good.uuid, table)
            self.assertEqual(
                0,
                await asyncio.to_thread(
                    run, "web@2", "--node", good.uuid, "--node", patched.uuid
                ),
            )
            self.assertEqual(
                0,
                await asyncio.to_thread(
                    run, "web@1", "-f", "json", "--node", good.uuid
                ),
            )
            with self.assertRaises(osc_exceptions.CommandError) as ctx:
                await asyncio.to_thread(run, "web@9", "--all")
            self.assertIn("unknown_policy", str(ctx.exception))


class CandidateCheckApiTest(PolicyCheckApiTest):
    """``POST /v1/policies/runtime/check``: a document that is not stored,
    judged as :meth:`PolicyStore.add` would store it; nothing is stored."""

    PATH = "/v1/policies/runtime/check"

    async def two_nodes(self) -> tuple[Verifier, KernelAgent, KernelAgent, str]:
        """Two nodes attested under web@1 (its digest returned); the
        second then ran a file web@1 does not allow."""
        verifier = self.new_verifier()
        good, patched = self.new_kernel_agent(), self.new_kernel_agent()
        meta, _ = verifier.policies.add(
            "runtime", self.list_policy(good, 1), project=PROJECT
        )
        await self.enrolled(verifier, good)
        await self.enrolled(verifier, patched)
        patched.kernel.measure("/usr/bin/new-tool", b"v2")
        return verifier, good, patched, str(meta["digest"])

    def body(self, document: object, **nodes: Any) -> bytes:
        return json.dumps({"policy": document, **nodes}).encode()

    async def test_candidate_passes_and_fails_listing_entries(self) -> None:
        verifier, good, patched, _ = await self.two_nodes()
        stored = verifier.policies.list("runtime", PROJECT)
        before = {a.uuid: self.snapshot(verifier, a.uuid) for a in (good, patched)}
        document = self.list_policy(good, 2)  # lacks new-tool
        status, data = await self.call(
            verifier, self.PATH, self.body(document, nodes=[good.uuid, patched.uuid])
        )
        self.assertEqual(200, status, data)
        report = PolicyCheckReport.from_dict(data)
        digest = hashlib.sha256(canonical(document)).hexdigest()
        self.assertEqual(("web", 2, digest), astuple(report.policy))
        first, second = report.results
        self.assertEqual((good.uuid, CheckResult.PASS), (first.node, first.result))
        self.assertEqual(CheckResult.FAIL, second.result)
        self.assertEqual(
            [(2, "/usr/bin/new-tool", "unknown_file")],
            [(f.index, f.path, f.reason) for f in second.failures],
        )
        # nothing stored, nothing about the nodes changed
        self.assertEqual(stored, verifier.policies.list("runtime", PROJECT))
        for agent in (good, patched):
            self.assertEqual(before[agent.uuid], self.snapshot(verifier, agent.uuid))
        # the same document with the new file passes both
        status, data = await self.call(
            verifier, self.PATH, self.body(self.list_policy(patched, 2), all=True)
        )
        self.assertEqual(200, status, data)
        self.assertEqual(["pass", "pass"], [r["result"] for r in data["results"]], data)

    async def test_delta_candidate_is_composed_with_its_base(self) -> None:
        verifier, good, patched, base = await self.two_nodes()
        full = self.list_policy(patched, 2)
        additions = {"/usr/bin/new-tool": full["digests"]["/usr/bin/new-tool"]}
        delta = {"name": "web", "version": 2, "base": base, "digests": additions}
        stored = verifier.policies.list("runtime", PROJECT)
        status, data = await self.call(
            verifier, self.PATH, self.body(delta, nodes=[good.uuid, patched.uuid])
        )
        self.assertEqual(200, status, data)
        self.assertEqual(["pass", "pass"], [r["result"] for r in data["results"]])
        self.assertEqual(stored, verifier.policies.list("runtime", PROJECT))
        # the digest is the one the stored delta gets
        meta, created = verifier.policies.add("runtime", delta, project=PROJECT)
        self.assertTrue(created)
        self.assertEqual(
            {"name": "web", "version": 2, "digest": meta["digest"]}, data["policy"]
        )
        # without its base the additions alone refuse the rest of the list
        alone = {k: v for k, v in delta.items() if k != "base"}
        status, data = await self.call(
            verifier, self.PATH, self.body(alone, nodes=[good.uuid])
        )
        self.assertEqual(200, status, data)
        self.assertEqual("fail", data["results"][0]["result"])
        self.assertIn(
            "/usr/bin/python3", [f["path"] for f in data["results"][0]["failures"]]
        )

    async def test_bad_candidate_is_a_named_4xx_and_stores_nothing(self) -> None:
        verifier, good, _, base = await self.two_nodes()
        foreign = self.new_kernel_agent()
        foreign.kernel.measure("/usr/bin/theirs", b"t")  # not web@1's content
        other, _ = verifier.policies.add(
            "runtime", self.list_policy(foreign, 1), project=OTHER
        )
        self.assertNotEqual(base, other["digest"])
        missing = "ab" * 32
        stored = verifier.policies.list("runtime", PROJECT)
        nodes = {"nodes": [good.uuid]}
        cases = {
            "not an object": (self.body([], **nodes), 400, "bad_policy", "'policy'"),
            "no name": (self.body({"version": 2}, **nodes), 400, "bad_policy",
                        "name"),
            "bad digest": (
                self.body({"name": "web", "version": 2,
                           "digests": {"/x": ["sha256:zz"]}}, **nodes),
                400, "bad_policy", "/x"),
            "bad base": (
                self.body({"name": "web", "version": 2, "base": "x"}, **nodes),
                400, "bad_policy", "base"),
            "older than its base": (
                self.body({"name": "web", "version": 1, "base": base}, **nodes),
                400, "bad_policy", "version"),
            "no policy": (json.dumps(nodes).encode(), 400, "bad_field",
                          "'policy'"),
            "no nodes": (self.body(self.list_policy(good, 2)), 400, "bad_field",
                         "'nodes'"),
            "not json": (b"{", 400, "bad_json", ""),
            "missing base": (
                self.body({"name": "web", "version": 2, "base": missing}, **nodes),
                404, "unknown_policy", missing),
            "another project's base": (
                self.body({"name": "web", "version": 2,
                           "base": other["digest"]}, **nodes),
                404, "unknown_policy", str(other["digest"])),
        }  # fmt: skip
        for name, (body, status, code, words) in cases.items():
            with self.subTest(name):
                got, data = await self.call(verifier, self.PATH, body)
                self.assertEqual(status, got, data)
                self.assertEqual(code, data["error"]["code"], data)
                self.assertIn(words, data["error"]["message"])
        self.assertEqual(stored, verifier.policies.list("runtime", PROJECT))
        self.assertEqual("attested", self.row(good.uuid).state)  # type: ignore[union-attr]

    async def test_too_large_is_413(self) -> None:
        verifier, good, _, _ = await self.two_nodes()
        document = self.list_policy(good, 2)
        body = self.body(document, all=True)
        app = make_app(
            verifier, public_pem(self.public_key), open_auth(), len(body) - 1
        )
        async with TestClient(TestServer(app)) as client:
            resp = await client.post(self.PATH, data=body)
            data = await resp.json()
        self.assertEqual(
            (413, "policy_too_large"), (resp.status, data["error"]["code"])
        )
        self.assertIn(str(len(body) - 1), data["error"]["message"])

    async def test_the_route_is_not_a_stored_policy_named_check(self) -> None:
        verifier, good, _, _ = await self.two_nodes()
        # a policy named "check" is still reached by its own routes
        named = {**self.list_policy(good, 1), "name": "check"}
        verifier.policies.add("runtime", named, project=PROJECT)
        app = make_app(verifier, public_pem(self.public_key), open_auth())
        async with TestClient(TestServer(app)) as client:
            resp = await client.get(self.PATH)
            self.assertEqual(200, resp.status)
            self.assertEqual("check", (await resp.json())["name"])
            resp = await client.post(
                "/v1/policies/runtime/check/check", json={"nodes": [good.uuid]}
            )
            data = await resp.json()
            self.assertEqual(200, resp.status, data)
            self.assertEqual("check", data["policy"]["name"])
            resp = await client.post(self.PATH, json={"nodes": [good.uuid]})
            data = await resp.json()
            self.assertEqual((400, "bad_field"), (resp.status, data["error"]["code"]))
