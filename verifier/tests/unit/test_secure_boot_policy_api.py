"""``POST /v1/policies/measured-boot`` with Secure Boot chain policies: a
dbx older than the verifier's minimum, a missing PK and an unknown field
are each a JSON 400 naming the problem; a good one is stored and read back.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import testtools
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from trusted_testing.auth import open_auth
from trusted_testing.secureboot_log import SecureBootBoot
from verifier.api.verifier_app import make_app as verifier_app
from verifier.attest.policies import PolicyStore
from verifier.cmd.verifier import load_min_dbx
from verifier.exceptions import ConfigError
from verifier.tests.unit.test_attest_service import VerifierServiceBase

PATH = "/v1/policies/measured-boot"


class ChainPolicyApiTest(VerifierServiceBase):
    def setUp(self) -> None:
        super().setUp()
        self.boot = SecureBootBoot()
        # the operator's minimum: the first four of the image's five entries
        self.minimum = frozenset("sha256:" + h.hex() for h in self.boot.dbx[:4])

    def _app(self) -> web.Application:
        verifier = self.new_verifier(
            policies=PolicyStore(self.engine, min_dbx=self.minimum)
        )
        return verifier_app(verifier, "PEM", open_auth())

    async def _post(self, policy: dict[str, Any]) -> tuple[int, Any]:
        body = json.dumps({"policy": policy, "name": "debian-12"}).encode()
        async with TestClient(TestServer(self._app())) as client:
            headers = {"Content-Type": "application/json"}
            resp = await client.post(PATH, data=body, headers=headers)
            return resp.status, await resp.json()

    async def test_chain_policy_is_stored_and_read_back(self) -> None:
        status, meta = await self._post(self.boot.policy())
        self.assertEqual(201, status, meta)
        async with TestClient(TestServer(self._app())) as client:
            resp = await client.get(f"{PATH}/debian-12")
            shown = await resp.json()
        self.assertEqual(200, resp.status, shown)
        self.assertEqual(5, len(shown["policy"]["dbx"]))
        self.assertTrue(shown["policy"]["pk"][0].startswith("x509:"))

    async def test_dbx_older_than_the_minimum_is_400(self) -> None:
        policy = self.boot.policy()
        policy["dbx"] = policy["dbx"][:2]
        status, body = await self._post(policy)
        self.assertEqual((400, "bad_policy"), (status, body["error"]["code"]))
        message = body["error"]["message"]
        self.assertIn(
            "dbx older than this verifier's minimum: lacks 2 of its 4", message
        )
        self.assertIn("sha256:" + self.boot.dbx[2].hex(), message)

    async def test_pinned_keys_without_dbx_are_400_under_a_minimum(self) -> None:
        policy = self.boot.policy()
        del policy["dbx"]
        status, body = await self._post(policy)
        self.assertEqual((400, "bad_policy"), (status, body["error"]["code"]))
        self.assertIn("dbx missing", body["error"]["message"])

    async def test_missing_pk_is_400(self) -> None:
        policy = self.boot.policy()
        del policy["pk"]
        status, body = await self._post(policy)
        self.assertEqual((400, "bad_policy"), (status, body["error"]["code"]))
        self.assertIn("pk missing", body["error"]["message"])

    async def test_unknown_field_is_400(self) -> None:
        status, body = await self._post(self.boot.policy() | {"kernel_cmdline": "x"})
        self.assertEqual((400, "bad_policy"), (status, body["error"]["code"]))
        self.assertIn("unknown keys ['kernel_cmdline']", body["error"]["message"])

    async def test_old_documents_are_not_held_to_the_minimum(self) -> None:
        status, body = await self._post(
            {"boot_applications": None, "secure_boot": True}
        )
        self.assertEqual(201, status, body)


class MinDbxFileTest(testtools.TestCase):
    def _file(self, text: str) -> str:
        fd, path = tempfile.mkstemp()
        os.write(fd, text.encode())
        os.close(fd)
        self.addCleanup(os.unlink, path)
        return path

    def test_entries_and_comments(self) -> None:
        path = self._file(f"# dbx 2024-01\nsha256:{'ab' * 32}  # BlackLotus\n\n")
        self.assertEqual(frozenset({"sha256:" + "ab" * 32}), load_min_dbx(path))
        self.assertEqual(frozenset(), load_min_dbx(None))

    def test_bad_entry_names_the_line(self) -> None:
        path = self._file(f"sha256:{'ab' * 32}\nsha256:abc\n")
        exc = self.assertRaises(ConfigError, load_min_dbx, path)
        self.assertIn("mb_min_dbx_file", str(exc))
        self.assertIn("line 2: 'sha256:abc' is not", str(exc))

    def test_missing_file_is_a_config_error(self) -> None:
        exc = self.assertRaises(ConfigError, load_min_dbx, "/nonexistent/dbx.txt")
        self.assertIn("mb_min_dbx_file /nonexistent/dbx.txt", str(exc))
