"""Limits on every API (issue 18): JSON nesting depth and integer size,
bodies read completely up to their limit, every refusal a JSON 4xx naming
the problem -- on the registrar, the verifier (and its policy API) and the
key service; the node agent's are in ``node_agent/tests/unit/test_agent``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import tempfile
import uuid
from typing import Any

import testtools
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from cryptography.hazmat.primitives.asymmetric import ed25519

from trusted_testing.auth import open_auth
from verifier.api.verifier_app import make_app as verifier_app
from verifier.common.web import parse_json_body
from verifier.db import make_engine, upgrade
from verifier.exceptions import RequestError
from verifier.keyservice import KeyService
from verifier.keyservice import make_app as keyservice_app
from verifier.protocol import jsonlimits
from verifier.protocol.errors import MalformedError
from verifier.registrar import Registrar
from verifier.registrar import make_app as registrar_app
from verifier.tests.unit.test_attest_service import VerifierServiceBase

DEEP = b'{"a": ' + b"[" * 20_000 + b"]" * 20_000 + b"}"  # under 64 KiB
BIG_INT = b'{"port": 99999999999999999999999}'


def _call(
    app: web.Application, method: str, path: str, body: bytes | None = None
) -> tuple[int, Any]:
    async def go() -> tuple[int, Any]:
        async with TestClient(TestServer(app)) as client:
            headers = {"Content-Type": "application/json"}
            resp = await client.request(method, path, data=body, headers=headers)
            return resp.status, await resp.json()

    return asyncio.run(go())


class JsonLimitsTest(testtools.TestCase):
    """The parser every API uses (:mod:`verifier.protocol.jsonlimits`)."""

    def test_deep_nesting_is_refused_before_parsing(self) -> None:
        exc = self.assertRaises(MalformedError, jsonlimits.loads, DEEP)
        self.assertIn("nested more than 64 levels", exc.detail)
        jsonlimits.loads(b"[" * 64 + b"]" * 64)
        self.assertRaises(MalformedError, jsonlimits.loads, b"[" * 65 + b"]" * 65)

    def test_brackets_inside_strings_do_not_count(self) -> None:
        text = json.dumps({"a": "[" * 1000, "b": '\\"{{{{'}).encode()
        self.assertEqual("[" * 1000, jsonlimits.loads(text)["a"])

    def test_integers_beyond_64_bits_are_refused(self) -> None:
        exc = self.assertRaises(MalformedError, jsonlimits.loads, BIG_INT)
        self.assertIn("out of range", exc.detail)
        self.assertEqual(2**64 - 1, jsonlimits.loads(b"18446744073709551615"))
        self.assertEqual(-(2**63), jsonlimits.loads(b"-9223372036854775808"))
        self.assertRaises(MalformedError, jsonlimits.loads, b"18446744073709551616")
        self.assertRaises(MalformedError, jsonlimits.loads, b"-9223372036854775809")

    def test_non_finite_numbers_are_refused(self) -> None:
        for text in (b"NaN", b"Infinity", b"-Infinity", b"1e400"):
            self.assertRaises(MalformedError, jsonlimits.loads, text)

    def test_syntax_errors_name_the_position(self) -> None:
        exc = self.assertRaises(MalformedError, jsonlimits.loads, b'{"a":\n  1,}')
        self.assertIn("line 2 column", exc.detail)

    def test_unterminated_strings_are_linear(self) -> None:
        # every quote escaped: a naive string pattern rescans from each one
        text = b'"\\' * 500_000
        self.assertRaises(MalformedError, jsonlimits.loads, text)

    def test_bootstrap_file_nested_deeply_is_malformed(self) -> None:
        # raised RecursionError (outside the project's errors) before
        from verifier.protocol.userdata import BootstrapConfig

        exc = self.assertRaises(MalformedError, BootstrapConfig.from_json, DEEP)
        self.assertIn("nested more than 64 levels", exc.detail)

    def test_request_bodies_map_to_bad_json(self) -> None:
        for body in (DEEP, BIG_INT, b"[1]", b"\xff", b"{"):
            exc = self.assertRaises(RequestError, parse_json_body, body)
            self.assertEqual(("bad_json", 400), (exc.code, exc.status))


class RegistrarLimitsTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        engine = make_engine("sqlite:///" + os.path.join(tmp.name, "r.db"))
        self.addCleanup(engine.dispose)
        upgrade(engine)
        self.registrar = Registrar(engine)
        self.path = f"/v1/agents/{uuid.uuid4()}"

    def test_registrar_deeply_nested_body_is_400_bad_json(self) -> None:
        status, data = _call(registrar_app(self.registrar), "POST", self.path, DEEP)
        self.assertEqual((400, "bad_json"), (status, data["error"]["code"]))
        self.assertIn("nested", data["error"]["message"])

    def test_registrar_integer_over_64_bits_is_400_bad_json(self) -> None:
        status, data = _call(registrar_app(self.registrar), "POST", self.path, BIG_INT)
        self.assertEqual((400, "bad_json"), (status, data["error"]["code"]))
        self.assertIn("out of range", data["error"]["message"])


class KeyServiceLimitsTest(testtools.TestCase):
    def test_keyservice_deeply_nested_body_is_400_bad_json(self) -> None:
        svc = KeyService(
            os.urandom(32),
            [ed25519.Ed25519PrivateKey.generate().public_key()],
            ed25519.Ed25519PrivateKey.generate(),
        )
        status, data = _call(
            keyservice_app(svc, "PEM"), "POST", "/v1/revocations", DEEP
        )
        self.assertEqual((400, "bad_json"), (status, data["error"]["code"]))


def _runtime_policy(entries: int) -> dict[str, Any]:
    return {
        "name": "big",
        "version": 1,
        "digests": {
            f"/usr/lib/x86_64-linux-gnu/lib{i}.so": [
                "sha256:" + hashlib.sha256(str(i).encode()).hexdigest()
            ]
            for i in range(entries)
        },
    }


class VerifierLimitsTest(VerifierServiceBase):
    def _app(self) -> web.Application:
        return verifier_app(self.new_verifier(), "PEM", open_auth())

    async def _call(self, method: str, path: str, body: bytes | None = None) -> Any:
        async with TestClient(TestServer(self._app())) as client:
            headers = {"Content-Type": "application/json"}
            resp = await client.request(method, path, data=body, headers=headers)
            return resp.status, await resp.json()

    async def test_verifier_deeply_nested_body_is_400_bad_json(self) -> None:
        status, data = await self._call("POST", "/v1/nodes", DEEP)
        self.assertEqual((400, "bad_json"), (status, data["error"]["code"]))

    async def test_policy_upload_deeply_nested_is_400_bad_json(self) -> None:
        status, data = await self._call("POST", "/v1/policies/runtime", DEEP)
        self.assertEqual((400, "bad_json"), (status, data["error"]["code"]))

    async def test_policy_ref_with_huge_version_is_400_not_500(self) -> None:
        path = "/v1/policies/runtime/web@99999999999999999999999"
        status, data = await self._call("GET", path)
        self.assertEqual((400, "bad_field"), (status, data["error"]["code"]))
        self.assertIn("an integer from 0 to", data["error"]["message"])

    async def test_policy_ref_with_non_ascii_digits_is_400(self) -> None:
        status, data = await self._call("GET", "/v1/policies/runtime/web@\u00b2")
        self.assertEqual((400, "bad_field"), (status, data["error"]["code"]))

    async def test_policy_version_beyond_the_column_is_400(self) -> None:
        policy = _runtime_policy(1) | {"version": 2**63}
        body = json.dumps({"policy": policy}).encode()
        status, data = await self._call("POST", "/v1/policies/runtime", body)
        self.assertEqual((400, "bad_policy"), (status, data["error"]["code"]))

    async def test_runtime_policy_of_several_megabytes_is_read_whole(self) -> None:
        # Read with one read() of the stream, only its first chunk arrived:
        # "bad_json: Unterminated string" from about 200 KB on.
        body = json.dumps({"policy": _runtime_policy(40_000)}).encode()
        self.assertGreater(len(body), 4 << 20)
        status, data = await self._call("POST", "/v1/policies/runtime", body)
        self.assertEqual(201, status, data)
        self.assertEqual(40_000, data["entries"])
