"""Another project's node looks exactly like a node nobody enrolled.

Two projects (``alpha``'s tenant and ``beta``'s, each with its token, a
stand-in authenticator in front of the real policy enforcer) on the
verifier's tenant API over a real socket. ``beta`` asks about ``alpha``'s
live node, about ``alpha``'s revoked node, and about a UUID nobody
enrolled, on every route that takes a node UUID (the tenant relay
included): the answers are the same bytes -- status, JSON body with the
asked UUID in place, and every header but the date and the request id --
so a project cannot probe which UUIDs exist.
"""

from __future__ import annotations

import base64
import json
import uuid as uuid_mod
from collections.abc import Mapping
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer
from oslo_config import cfg
from oslo_context import context

from verifier import conf as vconf
from verifier.api.authz import Auth
from verifier.api.verifier_app import make_app
from verifier.policies import make_enforcer
from verifier.tests.unit.test_attest_service import VerifierServiceBase

#: token -> project
_TOKENS = {"alpha-token": "alpha", "beta-token": "beta"}
#: Headers that differ between any two answers.
_VARYING = {"date", "x-openstack-request-id"}
_NONCE = "00" * 20
#: Every route of the tenant API that takes a node UUID: (method, path, body).
ROUTES: list[tuple[str, str, Any]] = [
    ("GET", "/v1/nodes/{}", None),
    ("DELETE", "/v1/nodes/{}", None),
    ("POST", "/v1/nodes/{}/revoke", {"detail": "probe"}),
    ("PUT", "/v1/nodes/{}/policy", {"runtime_policy": None}),
    ("POST", "/v1/nodes/{}/capabilities", {}),
    ("POST", "/v1/nodes/{}/instance-created", {}),
    ("PUT", "/v1/nodes/{}/host", {"host": "compute-1"}),
    ("GET", "/v1/nodes/{}/history", None),
    ("POST", "/v1/nodes/{}/relay/identity", {"nonce": _NONCE, "pcrs": [16]}),
    ("GET", "/v1/nodes/{}/relay/identity?nonce=" + _NONCE, None),
    ("POST", "/v1/nodes/{}/relay/u", {"u": "AA==", "payload": "AA=="}),
    ("GET", "/v1/nodes/{}/relay/u", None),
]


class _TokenProjects:
    """Keystone stand-in: each token is a member of its project."""

    www_authenticate = 'Keystone uri="http://keystone.invalid"'

    async def authenticate(
        self, headers: Mapping[str, str]
    ) -> context.RequestContext | None:
        project = _TOKENS.get(headers.get("X-Auth-Token", ""))
        if project is None:
            return None
        return context.RequestContext(
            user_id=f"user-{project}", project_id=project, roles=["member", "reader"]
        )


class UnknownNodeAnswerTest(VerifierServiceBase):
    async def asyncSetUp(self) -> None:
        await super().asyncSetUp()
        self.verifier = self.new_verifier()
        self.quiesce(self.verifier)
        conf = cfg.ConfigOpts()
        vconf.register_opts(conf)
        conf([], project="trusted-cloud")
        auth = Auth(make_enforcer(conf), _TokenProjects())  # type: ignore[arg-type]
        self.server = TestServer(make_app(self.verifier, "PEM", auth), host="127.0.0.1")
        await self.server.start_server()
        self.http = aiohttp.ClientSession()
        self.live = await self._enrol_as_alpha()
        self.revoked = await self._enrol_as_alpha()
        revoke = f"/v1/nodes/{self.revoked}/revoke"
        status, _ = await self._call("alpha", "POST", revoke)
        self.assertEqual(200, status)

    async def asyncTearDown(self) -> None:
        await self.http.close()
        await self.server.close()
        await super().asyncTearDown()

    async def _enrol_as_alpha(self) -> str:
        agent = self.new_agent()
        body = {
            "uuid": agent.uuid,
            "v": base64.b64encode(b"\x01" * 32).decode(),
            "u_commitment": base64.b64encode(bytes(32)).decode(),
            "policy": {"hash": "sha256", "pcrs": {"16": ["00" * 32]}},
        }
        status, data = await self._call("alpha", "POST", "/v1/nodes", body)
        self.assertEqual(201, status, data)
        return agent.uuid

    async def _call(
        self, project: str, method: str, path: str, body: Any = None
    ) -> tuple[int, bytes]:
        _, raw = await self._answer(project, method, path, body)
        return raw[0], raw[1]

    async def _answer(
        self, project: str, method: str, path: str, body: Any = None
    ) -> tuple[dict[str, str], tuple[int, bytes]]:
        token = {"alpha": "alpha-token", "beta": "beta-token"}[project]
        url = str(self.server.make_url(path))
        data = None if body is None else json.dumps(body).encode()
        headers = {"X-Auth-Token": token, "Content-Type": "application/json"}
        async with self.http.request(method, url, data=data, headers=headers) as resp:
            kept = {k.lower(): v for k, v in resp.headers.items()}
            for name in _VARYING:
                kept.pop(name, None)
            return kept, (resp.status, await resp.read())

    async def _seen_by_beta(
        self, method: str, path: str, body: Any, node: str
    ) -> tuple[int, bytes, dict[str, str]]:
        headers, (status, raw) = await self._answer(
            "beta", method, path.format(node), body
        )
        return status, raw.replace(node.encode(), b"<uuid>"), headers

    async def _assert_same_as_unknown(self, node: str) -> None:
        for method, path, body in ROUTES:
            with self.subTest(method=method, path=path):
                nobody = str(uuid_mod.uuid4())
                theirs = await self._seen_by_beta(method, path, body, node)
                unknown = await self._seen_by_beta(method, path, body, nobody)
                self.assertEqual(unknown, theirs)
                self.assertIn(unknown[0], (403, 404), unknown)

    async def test_another_projects_node_answers_as_an_unknown_uuid(self) -> None:
        await self._assert_same_as_unknown(self.live)

    async def test_another_projects_revoked_node_answers_as_an_unknown_uuid(
        self,
    ) -> None:
        await self._assert_same_as_unknown(self.revoked)
