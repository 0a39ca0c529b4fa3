"""The tenant library without services: what it sends where, and what it
refuses, with in-memory stand-ins for the Keystone session and the agents."""

from __future__ import annotations

import asyncio
import os
import types
from typing import Any

import fixtures
import testtools

from nova_plugin import direct
from nova_plugin.exceptions import AgentError, ServiceError
from nova_plugin.tenant import Tenant, TenantConfig
from verifier.common import tls
from verifier.common.http import Answer

UUID = "00000000-0000-4000-8000-000000000001"
REGISTRAR = "https://registrar.test"
VERIFIER = "https://verifier.test"


class FakeSession:
    """An :class:`AttestationClient` that answers every call with ``answer``."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.calls: list[tuple[str, str]] = []

    def call(self, method: str, path: str, body: Any = None) -> Any:
        self.calls.append((method, path))
        return self.answer


class FakeAgentClient:
    """:class:`AgentClient` that records the paths it would call."""

    made: list[FakeAgentClient] = []

    def __init__(self, cert_file: str, key_file: str, timeout: float) -> None:
        self.paths: list[str] = []
        FakeAgentClient.made.append(self)

    async def close(self) -> None:
        pass

    async def request(
        self, method: str, base: str, agent_cert: str, path: str, **kwargs: Any
    ) -> Answer:
        self.paths.append(path)
        return Answer(200, {}, b"", {"path": "/var/lib/trusted-cloud-agent/sealed"})


RECORD = types.SimpleNamespace(base_url="https://node.test:9002", tls_cert="PEM")


def write_certificate(directory: str) -> tuple[str, str]:
    """A fresh self-signed tenant certificate and its key in
    ``directory``; their paths."""
    key_pem, cert_pem = tls.self_signed_certificate("tenant", [])
    cert, key = os.path.join(directory, "cert"), os.path.join(directory, "key")
    with open(cert, "wb") as f:
        f.write(cert_pem)
    with open(key, "wb") as f:
        f.write(key_pem)
    return cert, key


def _run(work: Any) -> Any:
    return asyncio.run(work)


def _tenant(direct_agents: bool = False, answer: Any = None) -> Tenant:
    config = TenantConfig(
        REGISTRAR, VERIFIER, None, None, None, direct_agents=direct_agents
    )
    session = FakeSession(answer)
    return Tenant(config, verifier=session, registrar=session)  # type: ignore[arg-type]


class ServiceAnswerTest(testtools.TestCase):
    """Every answer of the registrar or the verifier is a JSON object."""

    def test_an_answer_without_a_body_is_an_empty_object(self) -> None:
        tenant = _tenant(answer=None)
        self.assertEqual({}, _run(tenant.request("DELETE", f"{VERIFIER}/v1/nodes/x")))

    def test_an_answer_that_is_not_an_object_is_a_service_error(self) -> None:
        tenant = _tenant(answer=["not", "an", "object"])
        with self.assertRaises(ServiceError) as ctx:
            _run(tenant.status(UUID))
        self.assertIn("not a JSON object", str(ctx.exception))

    def test_the_answer_itself_is_returned(self) -> None:
        view = {"uuid": UUID, "state": "attested"}
        self.assertEqual(view, _run(_tenant(answer=view).status(UUID)))


class DirectPathGuardTest(testtools.TestCase):
    """A node's bootstrap (its identity quote, U) reaches its agent directly
    only with ``direct_agents``; a call to the agent's own API
    (``send-sealed``) must not open that path for the rest of the tenant's
    life."""

    def setUp(self) -> None:
        super().setUp()
        FakeAgentClient.made = []
        self.useFixture(
            fixtures.MockPatchObject(direct, "AgentClient", FakeAgentClient)
        )

    def _paths(self) -> list[str]:
        return [path for client in FakeAgentClient.made for path in client.paths]

    def _bootstrap(self, agents: direct.DirectAgents) -> Any:
        return _run(agents.bootstrap_call(UUID, RECORD, "GET", "/v1/quote"))  # type: ignore[arg-type]

    def test_an_agent_api_call_first_does_not_open_the_direct_bootstrap_path(
        self,
    ) -> None:
        agents = direct.DirectAgents("cert.pem", "key.pem", 1.0)
        _run(agents.call(UUID, RECORD, "POST", "/v1/sealed", body={}))  # type: ignore[arg-type]
        with self.assertRaises(AgentError) as ctx:
            self._bootstrap(agents)
        self.assertIn("through the verifier's relay", str(ctx.exception))
        self.assertEqual(["/v1/sealed"], self._paths())

    def test_tenant_agent_request_first_keeps_the_bootstrap_off_the_direct_path(
        self,
    ) -> None:
        cert, key = write_certificate(self.useFixture(fixtures.TempDir()).path)
        tenant = Tenant(TenantConfig(REGISTRAR, VERIFIER, cert, key, None))
        record = RECORD

        async def identity(uuid: str) -> object:
            return record

        tenant.identity = identity  # type: ignore[method-assign,assignment]
        answer = _run(tenant.agent_request(UUID, "POST", "/v1/sealed", {"blob": ""}))
        self.assertEqual("/var/lib/trusted-cloud-agent/sealed", answer["path"])
        with self.assertRaises(AgentError):
            self._bootstrap(tenant._agents)
        self.assertEqual(["/v1/sealed"], self._paths())

    def test_with_direct_agents_the_bootstrap_reaches_the_agent(self) -> None:
        agents = direct.DirectAgents("cert.pem", "key.pem", 1.0, bootstrap=True)
        self._bootstrap(agents)
        self.assertEqual(["/v1/quote"], self._paths())

    def test_the_direct_path_without_a_certificate_is_refused_at_once(
        self,
    ) -> None:
        self.assertRaises(
            ServiceError, direct.DirectAgents, None, None, 1.0, bootstrap=True
        )
        agents = direct.DirectAgents(None, None, 1.0)  # the relay needs none
        with self.assertRaises(ServiceError) as ctx:
            _run(agents.call(UUID, RECORD, "POST", "/v1/sealed"))  # type: ignore[arg-type]
        self.assertIn("needs a tenant certificate", str(ctx.exception))
