"""The key service under a real Keystone: a project stores secrets with its
token, each project in its own namespace; a node gets only the secrets,
LKH groups and filegroups of the project its capability names (the
verifier puts the node's project in it). A project sees only its own
groups and filegroups (another's are 404), an admin sees all. One named
test per attack; each leaves the other project's state as it was.
"""

from __future__ import annotations

import base64
import os
import time
import uuid as uuid_mod
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer
from cryptography.hazmat.primitives.asymmetric import ed25519

from verifier.api.authz import Auth
from verifier.api.keystone import KeystoneAuthenticator
from verifier.api.verifier_app import make_app as make_verifier_app
from verifier.attest.grants import CapabilityIssuer
from verifier.exceptions import NotFoundError
from verifier.keyservice import KeyService
from verifier.keyservice.app import make_app
from verifier.policies import make_enforcer
from verifier.protocol import RevocationEvent
from verifier.protocol.capability import issue
from verifier.protocol.lkh import LkhMember, Welcome
from verifier.protocol.messages.keyservice import FilegroupState
from verifier.tests.functional.tenancy_base import KeystoneTestBase, unittest


class KeyServiceTenancyTest(KeystoneTestBase):
    async def asyncSetUp(self) -> None:
        await super().asyncSetUp()
        self.mac_key = os.urandom(32)
        signing = ed25519.Ed25519PrivateKey.generate()
        self.controller = signing.public_key()
        self.events = ed25519.Ed25519PrivateKey.generate()
        self.keys = KeyService(self.mac_key, [self.events.public_key()], signing)
        conf = self.service_conf()
        auth = Auth(make_enforcer(conf), KeystoneAuthenticator(conf))
        app = make_app(self.keys, "PEM", None, auth)
        self.ks_server = TestServer(app, host="127.0.0.1")
        await self.ks_server.start_server()

    async def asyncTearDown(self) -> None:
        await self.ks_server.close()
        await super().asyncTearDown()

    async def ks(
        self, method: str, path: str, token: str | None = None, **kw: Any
    ) -> tuple[int, Any]:
        headers = kw.pop("headers", {})
        if token is not None:
            headers["X-Auth-Token"] = token
        url = str(self.ks_server.make_url(path))
        async with aiohttp.ClientSession() as http:
            async with http.request(method, url, headers=headers, **kw) as resp:
                return resp.status, None if resp.status == 204 else await resp.json()

    async def put(self, who: str, name: str, secret: bytes) -> int:
        body = {"secret": base64.b64encode(secret).decode()}
        status, _ = await self.ks(
            "PUT", f"/v1/secrets/{name}", self.tokens[who], json=body
        )
        return status

    def capability(
        self, who: str, obj: str, right: str, node: str | None = None
    ) -> str:
        """The capability the verifier would issue a node of ``who``'s
        project (naming that project)."""
        cap = issue(
            self.mac_key, node or str(uuid_mod.uuid4()), obj, right,
            int(time.time()) + 300, 0, os.urandom(16), self.project_of(who),
        )  # fmt: skip
        return cap.to_token()

    async def read_as_node_of(self, who: str, name: str) -> tuple[int, Any]:
        """A node of ``who``'s project reads ``name``."""
        token = self.capability(who, f"secret:{name}", "r")
        headers = {"Authorization": f"Capability {token}"}
        return await self.ks("GET", f"/v1/secrets/{name}", headers=headers)

    async def join_as(self, who: str, node: str, gid: str) -> Welcome:
        """Node ``node`` of ``who``'s project joins group ``gid``."""
        token = self.capability(who, f"group:{gid}", "j", node)
        headers = {"Authorization": f"Capability {token}"}
        status, data = await self.ks("POST", f"/v1/groups/{gid}/join", headers=headers)
        self.assertEqual(200, status, data)
        return Welcome.from_dict(data)

    async def read_filegroup_as(self, who: str, node: str, fg: str) -> Any:
        token = self.capability(who, f"filegroup:{fg}", "r", node)
        headers = {"Authorization": f"Capability {token}"}
        status, data = await self.ks(
            "GET", f"/v1/filegroups/{fg}/state", headers=headers
        )
        self.assertEqual(200, status, data)
        return FilegroupState.from_dict(data).reader_state()

    async def test_project_stores_and_its_node_reads_its_secret(self) -> None:
        self.assertEqual(204, await self.put("alice", "db-password", b"alpha's"))
        status, data = await self.read_as_node_of("alice", "db-password")
        self.assertEqual(200, status, data)
        self.assertEqual(b"alpha's", base64.b64decode(data["secret"]))

    async def test_other_project_cannot_overwrite_a_secret(self) -> None:
        await self.put("alice", "db-password", b"alpha's")
        self.assertEqual(204, await self.put("bob", "db-password", b"beta's"))
        # beta stored its own secret of that name; alpha's is unchanged
        _, data = await self.read_as_node_of("alice", "db-password")
        self.assertEqual(b"alpha's", base64.b64decode(data["secret"]))

    async def test_node_of_other_project_cannot_read_a_secret(self) -> None:
        await self.put("alice", "db-password", b"alpha's")
        status, data = await self.read_as_node_of("bob", "db-password")
        self.assertEqual((404, "unknown_secret"), (status, data["error"]["code"]))

    async def test_reader_cannot_store_and_no_token_is_refused(self) -> None:
        self.assertEqual(403, await self.put("rita", "x", b"no"))
        body = {"secret": base64.b64encode(b"no").decode()}
        status, _ = await self.ks("PUT", "/v1/secrets/x", "not-a-token", json=body)
        self.assertEqual(401, status)
        self.assertEqual(0, len(self.keys._secrets))

    async def test_capability_names_the_nodes_project_and_not_anothers(
        self,
    ) -> None:
        """The verifier issues a capability only to the node's project, and
        the capability carries that project: another project asking for
        one for alpha's node gets 404 and nothing is issued."""
        issuer = CapabilityIssuer(
            self.verifier.queries, self.verifier.outbox, self.mac_key, 60
        )
        app = make_verifier_app(self.verifier, "PEM", self.auth, issuer=issuer)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        self.addAsyncCleanup(server.close)
        good = {"hash": "sha256", "pcrs": {"16": [self._good_pcr16().hex()]}}
        agent = await self.enrol_node("alice", policy=good)
        self.assertEqual(
            "attested", (await self.verifier.rounds.attest_once(agent.uuid)).state
        )
        await self.put("alice", "db-password", b"alpha's")
        await self.put("bob", "db-password", b"beta's")
        url = str(server.make_url(f"/v1/nodes/{agent.uuid}/capabilities"))
        body = {"object": "secret:db-password", "rights": "r"}
        grants = {}
        for who in ("bob", "alice"):
            headers = {"X-Auth-Token": self.tokens[who]}
            async with self.http.post(url, json=body, headers=headers) as resp:
                grants[who] = (resp.status, await resp.json())
        self.assertEqual(404, grants["bob"][0])
        self.assertEqual("unknown_node", grants["bob"][1]["error"]["code"])
        status, grant = grants["alice"]
        self.assertEqual(201, status, grant)
        headers = {"Authorization": f"Capability {grant['token']}"}
        status, data = await self.ks("GET", "/v1/secrets/db-password", headers=headers)
        self.assertEqual((200, b"alpha's"), (status, base64.b64decode(data["secret"])))

    # -- LKH groups and filegroups: one namespace per project -----------------

    async def test_groups_of_one_name_in_two_projects_are_two_groups(self) -> None:
        a, b = str(uuid_mod.uuid4()), str(uuid_mod.uuid4())
        alpha = LkhMember(await self.join_as("alice", a, "web"), self.controller)
        alpha_key = alpha.group_key()
        beta = LkhMember(await self.join_as("bob", b, "web"), self.controller)
        self.assertNotEqual(alpha_key, beta.group_key())
        # beta's join did not rekey alpha's group: no message for alpha
        self.assertEqual([], self.keys.rekey_messages("web", alpha.epoch, a))
        self.assertEqual(alpha_key, alpha.group_key())
        self.assertEqual(1, self.keys.group_epoch("web", a))

    async def test_node_of_other_project_gets_no_rekey_messages(self) -> None:
        a, b = str(uuid_mod.uuid4()), str(uuid_mod.uuid4())
        await self.join_as("alice", a, "web")
        await self.join_as("alice", str(uuid_mod.uuid4()), "web")
        # b holds a capability of beta (it read beta's filegroup) but is in
        # no group of alpha: alpha's group "web" does not exist for it
        await self.read_filegroup_as("bob", b, "docs")
        with self.assertRaises(NotFoundError) as ctx:
            self.keys.rekey_messages("web", 0, b)
        self.assertEqual("unknown_group", ctx.exception.code)
        unknown = str(uuid_mod.uuid4())  # never showed a capability
        self.assertRaises(NotFoundError, self.keys.rekey_messages, "web", 0, unknown)
        self.assertEqual(2, len(self.keys.rekey_messages("web", 0, a)))

    async def test_other_project_cannot_see_a_group_or_filegroup(self) -> None:
        a = str(uuid_mod.uuid4())
        await self.join_as("alice", a, "web")
        await self.read_filegroup_as("alice", a, "docs")
        alpha = self.project_of("alice")
        for kind, name in (("groups", "web"), ("filegroups", "docs")):
            status, body = await self.ks("GET", f"/v1/{kind}", self.tokens["bob"])
            self.assertEqual((200, []), (status, body[kind]))
            status, body = await self.ks(
                "GET", f"/v1/{kind}/{name}", self.tokens["bob"]
            )
            self.assertEqual(404, status, body)
            self.assertEqual(f"unknown_{kind[:-1]}", body["error"]["code"])
            status, body = await self.ks("GET", f"/v1/{kind}", self.tokens["rita"])
            self.assertEqual(200, status, body)
            self.assertEqual(
                [(name, alpha)], [(g[kind[:-1]], g["project"]) for g in body[kind]]
            )
            status, _ = await self.ks("GET", f"/v1/{kind}", "not-a-token")
            self.assertEqual(401, status)
        self.assertEqual(1, self.keys.group_epoch("web", a))  # unchanged

    async def test_admin_sees_the_groups_of_every_project(self) -> None:
        await self.join_as("alice", str(uuid_mod.uuid4()), "web")
        await self.join_as("bob", str(uuid_mod.uuid4()), "web")
        status, body = await self.ks("GET", "/v1/groups", self.tokens["admin"])
        self.assertEqual(200, status, body)
        self.assertEqual(
            sorted([self.project_of("alice"), self.project_of("bob")]),
            sorted(g["project"] for g in body["groups"] if g["group"] == "web"),
        )
        path = f"/v1/groups/web?project={self.project_of('bob')}"
        status, body = await self.ks("GET", path, self.tokens["admin"])
        self.assertEqual((200, 1), (status, body["members"]))
        # a member's ?project= is ignored: it sees its own project only
        status, _ = await self.ks("GET", path, self.tokens["alice"])
        self.assertEqual(200, status)
        status, body = await self.ks("GET", path, self.tokens["alice"])
        self.assertEqual(self.project_of("alice"), body["project"])

    async def test_revoking_a_node_rotates_only_its_projects_filegroup(self) -> None:
        a, b = str(uuid_mod.uuid4()), str(uuid_mod.uuid4())
        alpha = await self.read_filegroup_as("alice", a, "docs")
        beta = await self.read_filegroup_as("bob", b, "docs")
        self.assertNotEqual(alpha.key(0), beta.key(0))
        event = RevocationEvent(
            str(uuid_mod.uuid4()), b, "pcr_policy", "PCR 16", "2026-01-01T00:00:00Z"
        )
        answer = self.keys.revoke(event.sign(self.events).to_dict())
        self.assertEqual(
            [f"{self.project_of('bob')}/docs"], answer["filegroups_rotated"]
        )
        b = str(uuid_mod.uuid4())  # another, attested, beta reader
        self.assertEqual(0, (await self.read_filegroup_as("alice", a, "docs")).version)
        self.assertEqual(1, (await self.read_filegroup_as("bob", b, "docs")).version)


if __name__ == "__main__":
    unittest.main()
