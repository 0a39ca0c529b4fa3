"""The registrar's read side under a real Keystone: a project reads the
registrations of its own instances (as Nova shows them), never another
project's; the cloud administrator reads all; writes stay closed to
tokens. One named test per attack; each leaves the registrar unchanged.
"""

from __future__ import annotations

import os
import uuid as uuid_mod
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer

from trusted_testing.softtpm import SoftTpm
from verifier.api.authz import Auth
from verifier.api.keystone import KeystoneAuthenticator
from verifier.attest.instances import NovaInstanceOwners
from verifier.common.http import AsyncClient
from verifier.db import make_engine, upgrade
from verifier.exceptions import RequestError
from verifier.policies import make_enforcer
from verifier.protocol import EvidenceError
from verifier.registrar import Registrar, make_app
from verifier.registrar.service import Registration
from verifier.tests.functional.tenancy_base import KeystoneTestBase, unittest
from verifier.tests.unit.test_registrar_api import CERT


class RegistrarTenancyTest(KeystoneTestBase):
    async def asyncSetUp(self) -> None:
        await super().asyncSetUp()
        engine = make_engine("sqlite:///" + self.tmp + "/r.db")
        self.addCleanup(engine.dispose)
        upgrade(engine)
        self.registrar = Registrar(engine)
        conf = self.service_conf()
        auth = Auth(make_enforcer(conf), KeystoneAuthenticator(conf))
        self.owners = NovaInstanceOwners(AsyncClient(None, 30.0))
        roles = {"agent": ["agent"], "reader": ["reader"], "admin": ["admin"]}
        app = make_app(self.registrar, roles, auth, self.owners)
        self.reg_server = TestServer(app, host="127.0.0.1")
        await self.reg_server.start_server()
        self.tpms: dict[str, SoftTpm] = {}
        self.alices = self.registered("alice")
        self.bobs = self.registered("bob")

    async def asyncTearDown(self) -> None:
        await self.reg_server.close()
        await self.owners.close()
        await super().asyncTearDown()

    def registered(self, who: str) -> str:
        """An activated registration of an instance of ``who``'s project."""
        uuid = str(uuid_mod.uuid4())
        self.nova.add_server(uuid, self.project_of(who))
        tpm = self.tpms[uuid] = SoftTpm(ak_alg="ecc", ek_alg="ecc")
        challenge = self.registrar.register(
            Registration(uuid, tpm.ek.to_bytes(), None, tpm.ak.to_bytes(), CERT,
                         "192.0.2.7", 8892)
        )  # fmt: skip
        self.registrar.activate(
            uuid,
            tpm.activate_credential(
                challenge.credential_blob, challenge.encrypted_secret
            ),
        )
        return uuid

    async def reg(self, who: str | None, method: str, path: str) -> tuple[int, Any]:
        headers = {"X-Auth-Token": self.tokens[who]} if who else {}
        url = str(self.reg_server.make_url(path))
        async with aiohttp.ClientSession() as http:
            async with http.request(method, url, headers=headers) as resp:
                data = None if resp.status == 204 else await resp.json()
                return resp.status, data

    async def test_project_reads_its_own_registration_with_a_token(self) -> None:
        status, data = await self.reg("alice", "GET", f"/v1/agents/{self.alices}")
        self.assertEqual(
            (200, self.alices, True), (status, data["uuid"], data["activated"])
        )
        status, data = await self.reg("rita", "GET", f"/v1/agents/{self.alices}")
        self.assertEqual(200, status, data)  # a reader of the project

    async def test_other_projects_registration_is_not_found(self) -> None:
        status, data = await self.reg("bob", "GET", f"/v1/agents/{self.alices}")
        self.assertEqual((404, "unknown_instance"), (status, data["error"]["code"]))

    async def test_list_shows_only_the_callers_instances(self) -> None:
        status, data = await self.reg("bob", "GET", "/v1/agents")
        self.assertEqual(200, status, data)
        self.assertEqual([self.bobs], [a["uuid"] for a in data["agents"]])

    async def test_admin_reads_every_registration(self) -> None:
        status, data = await self.reg("admin", "GET", "/v1/agents")
        self.assertEqual(200, status, data)
        self.assertEqual({self.alices, self.bobs}, {a["uuid"] for a in data["agents"]})
        status, _ = await self.reg("admin", "GET", f"/v1/agents/{self.bobs}")
        self.assertEqual(200, status)

    async def test_token_cannot_delete_a_registration(self) -> None:
        for who in ("bob", "alice"):
            status, data = await self.reg(who, "DELETE", f"/v1/agents/{self.alices}")
            self.assertEqual((403, "forbidden"), (status, data["error"]["code"]))
        self.assertTrue(self.registrar.get(self.alices).activated)

    async def test_bad_token_and_no_token_are_401(self) -> None:
        headers = {"X-Auth-Token": "not-a-token"}
        url = str(self.reg_server.make_url(f"/v1/agents/{self.alices}"))
        async with aiohttp.ClientSession() as http:
            async with http.get(url, headers=headers) as resp:
                self.assertEqual(401, resp.status)
        # neither a token nor a certificate: no identity
        status, data = await self.reg(None, "GET", f"/v1/agents/{self.alices}")
        self.assertEqual((401, "unauthorized"), (status, data["error"]["code"]))

    async def test_list_follows_novas_pages(self) -> None:
        self.addCleanup(setattr, self.nova, "max_limit", self.nova.max_limit)
        self.nova.max_limit = 2  # Nova's [api] max_limit, small
        more = {self.registered("alice") for _ in range(4)}
        before = len(self.nova.requests)
        status, data = await self.reg("alice", "GET", "/v1/agents")
        self.assertEqual(200, status, data)
        self.assertEqual(more | {self.alices}, {a["uuid"] for a in data["agents"]})
        pages = [p for p in self.nova.requests[before:] if "/servers" in p]
        # alpha's servers in pages of two (Nova links on from a full page)
        servers = [
            u for u, p in self.nova.servers.items() if p == self.project_of("alice")
        ]
        self.assertEqual(len(servers) // 2 + 1, len(pages), pages)
        self.assertTrue(all("marker=" in p for p in pages[1:]), pages)
        status, data = await self.reg("bob", "GET", "/v1/agents")
        self.assertEqual([self.bobs], [a["uuid"] for a in data["agents"]])

    async def test_foreign_ak_for_a_known_ek_changes_no_registration(self) -> None:
        """Why: anyone could re-register a node UUID with its (public) EK
        and their own AK. The old registration stays in force until the
        new AK is activated, which needs the node's TPM."""
        _, before = await self.reg("alice", "GET", f"/v1/agents/{self.alices}")
        attacker = SoftTpm(ak_alg="ecc", ek_alg="ecc")
        ek = self.tpms[self.alices].ek.to_bytes()
        challenge = self.registrar.register(
            Registration(self.alices, ek, None, attacker.ak.to_bytes(), CERT,
                         "203.0.113.9", 8892)
        )  # fmt: skip
        self.assertRaises(
            EvidenceError,
            attacker.activate_credential,
            challenge.credential_blob,
            challenge.encrypted_secret,
        )
        self.assertRaises(
            RequestError, self.registrar.activate, self.alices, os.urandom(32)
        )
        status, after = await self.reg("alice", "GET", f"/v1/agents/{self.alices}")
        self.assertEqual((200, before), (status, after))
        self.assertTrue(after["activated"])


if __name__ == "__main__":
    unittest.main()
