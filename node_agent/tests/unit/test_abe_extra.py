"""The agent without the ``abe`` extra: the CP-ABE routes answer 501 with a
JSON body naming the extra, everything else serves as usual."""

import os
import sys
from unittest import mock

from aiohttp.test_utils import TestClient, TestServer

from node_agent.server import make_app
from node_agent.tests.unit.test_agent import AgentTestBase

_ABE_ROUTES = (("POST", "/v1/keys/abe"), ("POST", "/v1/sealed"), ("GET", "/v1/abe"))


class TestAbeExtra(AgentTestBase):
    def _requests(self, calls):
        async def go():
            client = TestClient(TestServer(make_app(self.agent)))
            await client.start_server()
            try:
                answers = []
                for method, path in calls:
                    body = {} if method == "POST" else None
                    resp = await client.request(method, path, json=body)
                    answers.append((resp.status, await resp.json()))
                return answers
            finally:
                await client.close()

        return self.run_async(go())

    def test_abe_routes_name_the_missing_extra(self):
        with mock.patch.dict(sys.modules, {"pymcl": None}):
            answers = self._requests(_ABE_ROUTES)
        for (method, path), (status, body) in zip(_ABE_ROUTES, answers, strict=True):
            self.assertEqual(501, status, f"{method} {path}: {body}")
            self.assertEqual("extra_not_installed", body["error"]["code"])
            self.assertIn("pip install 'trusted-cloud[abe]'", body["error"]["message"])

    def test_other_routes_serve_without_the_abe_extra(self):
        nonce = os.urandom(8).hex()
        with mock.patch.dict(sys.modules, {"pymcl": None}):
            (status, _), (quote_status, quote) = self._requests(
                [("GET", "/v1/status"), ("GET", f"/v1/quote?nonce={nonce}&pcrs=16")]
            )
        self.assertEqual(200, status)
        self.assertEqual(200, quote_status, quote)

    def test_abe_routes_serve_with_the_abe_extra(self):
        [(status, body)] = self._requests([("GET", "/v1/abe")])
        self.assertEqual(200, status, body)
        self.assertEqual([], body["keys"])
