"""The attestation log's API (:mod:`verifier.api.log_app`) over a real
verifier service: the checkpoint note, a node's history with its proofs,
consistency proofs, a project's scope, and JSON 400s naming the
parameter."""

from __future__ import annotations

import base64
import dataclasses
import uuid as uuid_mod

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from oslo_context import context

from nova_plugin.loghistory import verify_saved
from trusted_testing.auth import open_auth
from verifier.api.authz import Auth
from verifier.api.verifier_app import make_app, public_pem
from verifier.protocol import translog
from verifier.tests.unit.test_attest_service import VerifierServiceBase


@dataclasses.dataclass(frozen=True)
class ProjectAuth(Auth):
    """Every caller is a reader and member of ``project``."""

    project: str = "p-other"

    async def identify(self, request: web.Request) -> context.RequestContext | None:
        return context.RequestContext(
            user_id="u", project_id=self.project, roles=["reader", "member"]
        )


class LogApiTest(VerifierServiceBase):
    async def revoked_node(self) -> str:
        verifier = self.new_verifier()
        agent = self.new_agent()
        await self.enrol(verifier, agent)
        await verifier.rounds.attest_once(agent.uuid)
        await verifier.commands.revoke(agent.uuid, "tenant_revoked", "done")
        verifier.log_pump.pass_once()
        return agent.uuid

    def client(self, auth: Auth | None = None) -> TestClient:
        app = make_app(
            self.verifiers[0], public_pem(self.public_key), auth or open_auth()
        )
        return TestClient(TestServer(app, host="127.0.0.1"))

    async def test_checkpoint_history_and_consistency(self) -> None:
        uuid = await self.revoked_node()
        async with self.client() as client:
            resp = await client.get("/v1/log/checkpoint")
            self.assertEqual(200, resp.status)
            self.assertEqual("text/plain; charset=utf-8", resp.headers["Content-Type"])
            note = await resp.text()
            name = translog.log_origin(self.public_key)
            kept = translog.open_checkpoint(note, self.public_key, name, name)
            self.assertEqual(2, kept.size)
            served = await (await client.get("/v1/log/checkpoint?format=json")).json()
            self.assertEqual(note, served["checkpoint"])
            self.assertIn("BEGIN PUBLIC KEY", served["key"])
            resp = await client.get(f"/v1/nodes/{uuid.upper()}/history")
            history = await resp.json()
            self.assertEqual(200, resp.status, history)
            verified = verify_saved({"history": history}, self.public_key)
            self.assertEqual(
                ["attested", "revoked"], [e.kind.value for e in verified.entries]
            )
            resp = await client.get("/v1/log/consistency?from=1&to=2")
            body = await resp.json()
            proof = [base64.b64decode(p) for p in body["proof"]]
            first = self.verifiers[0].log.consistency(0, 1)  # size 1's root is leaf 0's
            self.assertEqual([], first)
            self.assertEqual({"from": 1, "to": 2}, {k: body[k] for k in ("from", "to")})
            self.assertEqual(1, len(proof))

    async def test_bad_parameters_are_json_400_naming_them(self) -> None:
        uuid = await self.revoked_node()
        async with self.client() as client:
            for url, code in (
                (f"/v1/nodes/{uuid}/history?since=yesterday", "since"),
                (f"/v1/nodes/{uuid}/history?until=2026-13-01", "until"),
                (
                    f"/v1/nodes/{uuid}/history?since=2026-01-02&until=2026-01-01",
                    "until",
                ),
                ("/v1/log/consistency?from=1&to=9", "to"),
                ("/v1/log/consistency?from=2&to=1", "from"),
                ("/v1/log/consistency?from=-1&to=1", "from"),
                ("/v1/log/consistency?to=1", "from"),
            ):
                with self.subTest(url=url):
                    resp = await client.get(url)
                    body = await resp.json()
                    self.assertEqual(400, resp.status, body)
                    self.assertEqual(code, body["error"]["code"])

    async def test_another_projects_history_is_404_as_a_missing_node(self) -> None:
        uuid = await self.revoked_node()
        async with self.client(ProjectAuth(open_auth().enforcer)) as client:
            resp = await client.get(f"/v1/nodes/{uuid}/history")
            mine = await resp.json()
            resp2 = await client.get(f"/v1/nodes/{uuid_mod.uuid4()}/history")
            missing = await resp2.json()
            self.assertEqual((404, 404), (resp.status, resp2.status))
            self.assertEqual(mine["error"]["code"], missing["error"]["code"])
            # the checkpoint is anyone's
            self.assertEqual(200, (await client.get("/v1/log/checkpoint")).status)
