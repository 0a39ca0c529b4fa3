"""Every service's listener takes clients without a certificate (issue 30
item 4: load balancers call ``/healthcheck`` without credentials), so no
route may answer such a caller unless it is public by design.

Each test builds a service's real application (with the certificate roles
and policy of a deployment) and calls every route of it with no
certificate and no token: each answers 401 with the JSON error body,
except ``/healthcheck`` (200) and the routes listed in :data:`PUBLIC`,
each with the reason it is public. A new route is thus either guarded or
added here on purpose.
"""

from __future__ import annotations

import json
import re
import unittest
from typing import Any
from unittest import mock

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from oslo_config import cfg

from trusted_testing.lean_serve import LeanTestClient, LeanTestServer
from verifier.api.abe_app import add_abe_routes
from verifier.api.authz import Auth
from verifier.api.monitor_app import add_monitor_routes
from verifier.api.push_app import make_push_app
from verifier.api.verifier_app import make_app as verifier_app
from verifier.common.lean_server import LeanApp
from verifier.keyservice import make_app as keyservice_app
from verifier.policies import make_enforcer
from verifier.registrar import make_app as registrar_app

NODE = "3f2a6c1e-5b1d-4c1e-9a7e-0c6d2b8e4f10"

#: (service, method, path) answered without an identity, and why.
PUBLIC = {
    ("verifier", "GET", "/v1/signing-key"): "the event-signing public key",
    ("keyservice", "GET", "/v1/signing-key"): "the rekey-signing public key",
    ("verifier", "GET", "/v1/openapi.json"): "the API description",
    ("keyservice", "GET", "/v1/openapi.json"): "the API description",
    ("registrar", "GET", "/v1/openapi.json"): "the API description",
    ("push", "GET", "/v1/openapi.json"): "the API description",
    # a node proves itself with its TPM (credential activation)
    ("registrar", "POST", "/v1/agents/{uuid}"): "registration, TPM-bound",
    ("registrar", "POST", "/v1/agents/{uuid}/activate"): "activation, TPM-bound",
    # the push listener: nodes authenticate by a TPM-bound session
    ("push", "POST", "/v1/push/{uuid}/session"): "push session, TPM-bound",
    ("push", "POST", "/v1/push/{uuid}/session/proof"): "push session, TPM-bound",
    ("push", "POST", "/v1/push/{uuid}/challenge"): "push session, TPM-bound",
    ("push", "POST", "/v1/push/{uuid}/evidence"): "push session, TPM-bound",
}


def _enforcer() -> Any:
    conf = cfg.ConfigOpts()
    conf([], project="trusted-cloud")
    return make_enforcer(conf)


def _verifier(auth: Auth) -> web.Application:
    service = mock.Mock()  # never reached: every call stops before it

    def optional(app: web.Application) -> None:
        add_abe_routes(app, mock.Mock())
        add_monitor_routes(app, mock.Mock(), mock.Mock())

    return verifier_app(service, "PEM", auth, routes=[optional])


def _apps() -> dict[str, list[web.Application]]:
    """Each service's application as deployed: noauth (certificate roles)
    and with a policy-enforcing Auth (as with Keystone)."""
    enforcer = _enforcer()
    certificates = Auth.certificate_roles(["tenant"], {"service": ["operator"]})
    registrar_roles = {
        "agent": ["agent"],
        "reader": ["verifier"],
        "admin": ["operator"],
        "provider": ["vtpm"],
    }
    key_roles = {"tenant": ["tenant"], "verifier": ["verifier"]}
    return {
        "verifier": [
            _verifier(Auth(enforcer, None, certificates)),
            _verifier(Auth(enforcer)),
        ],
        "registrar": [
            registrar_app(mock.Mock(), registrar_roles),
            registrar_app(mock.Mock(), registrar_roles, Auth(enforcer)),
        ],
        "keyservice": [
            keyservice_app(mock.Mock(), "PEM", key_roles),
            keyservice_app(mock.Mock(), "PEM", key_roles, Auth(enforcer)),
        ],
        "push": [make_push_app(mock.Mock(**{"rules.max_evidence_bytes": 1024}))],
    }


def _routes(app: web.Application | LeanApp) -> list[tuple[str, str]]:
    if isinstance(app, LeanApp):
        return [(route.method, route.template) for route in app.routes]
    out = []
    for route in app.router.routes():
        path = route.resource.canonical if route.resource is not None else ""
        if route.method != "HEAD":
            out.append((route.method, path))
    return out


class AnonymousCallerTest(unittest.IsolatedAsyncioTestCase):
    async def _answers(
        self, app: web.Application | LeanApp, routes: list[tuple[str, str]]
    ) -> dict[tuple[str, str], tuple[int, Any]]:
        out = {}
        client: Any = (
            LeanTestClient(LeanTestServer(app))
            if isinstance(app, LeanApp)
            else TestClient(TestServer(app, host="127.0.0.1"))
        )
        async with client:
            for method, path in routes:
                url = re.sub(r"{[^}]*}", NODE, path)
                async with client.request(method, url, json={}) as resp:
                    text = await resp.text()
                    json_body = resp.content_type == "application/json"
                    out[(method, path)] = (
                        resp.status,
                        json.loads(text) if json_body else text,
                    )
            async with client.get("/healthcheck") as resp:
                out[("GET", "/healthcheck")] = (resp.status, await resp.text())
        return out

    async def test_every_route_refuses_a_caller_without_identity(self) -> None:
        checked, public = 0, set()
        for service, apps in _apps().items():
            for app in apps:
                routes = _routes(app)
                answers = await self._answers(app, routes)
                self.assertEqual(200, answers.pop(("GET", "/healthcheck"))[0])
                for (method, path), (status, body) in answers.items():
                    if (service, method, path) in PUBLIC:
                        public.add((service, method, path))
                        continue
                    where = f"{service} {method} {path}"
                    self.assertEqual(401, status, f"{where}: {body}")
                    self.assertEqual("unauthorized", body["error"]["code"], where)
                    checked += 1
        # the walk saw the routes it meant to (not an empty router)
        self.assertGreater(checked, 40)
        self.assertEqual(set(PUBLIC), public)

    async def test_the_stats_of_every_service_need_an_identity(self) -> None:
        # the counters name no project, but are still not for anyone
        for service in ("verifier", "keyservice"):
            app = _apps()[service][0]
            answers = await self._answers(app, [("GET", "/v1/stats")])
            self.assertEqual(401, answers[("GET", "/v1/stats")][0], service)


if __name__ == "__main__":
    unittest.main()
