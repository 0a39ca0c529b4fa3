"""The key service under a real Keystone: a project stores secrets with its
token, each project in its own namespace; a node gets only the secrets of
the project its capability names (the verifier puts the node's project in
it). One named test per attack; each leaves the other project's secret as
it was.
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
from verifier.keyservice import KeyService
from verifier.keyservice.app import make_app
from verifier.policies import make_enforcer
from verifier.protocol.capability import issue
from verifier.tests.functional.tenancy_base import KeystoneTestBase, unittest


class KeyServiceTenancyTest(KeystoneTestBase):
    async def asyncSetUp(self) -> None:
        await super().asyncSetUp()
        self.mac_key = os.urandom(32)
        self.keys = KeyService(
            self.mac_key,
            [ed25519.Ed25519PrivateKey.generate().public_key()],
            ed25519.Ed25519PrivateKey.generate(),
        )
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

    async def read_as_node_of(self, who: str, name: str) -> tuple[int, Any]:
        """A node of ``who``'s project reads ``name`` with a capability the
        verifier would issue it (naming the node's project)."""
        cap = issue(
            self.mac_key, str(uuid_mod.uuid4()), f"secret:{name}", "r",
            int(time.time()) + 300, 0, os.urandom(16), self.project_of(who),
        )  # fmt: skip
        headers = {"Authorization": f"Capability {cap.to_token()}"}
        return await self.ks("GET", f"/v1/secrets/{name}", headers=headers)

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


if __name__ == "__main__":
    unittest.main()
