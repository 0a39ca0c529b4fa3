"""The tenant library without services: what it sends where, and what it
refuses, with in-memory stand-ins for the Keystone session and the agents."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import fixtures
import testtools

from nova_plugin import tenant as tenant_mod
from nova_plugin.exceptions import AgentError, ServiceError
from nova_plugin.tenant import Tenant, TenantConfig

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


class FakeAgents:
    """:class:`DirectAgents` that records the calls it would make."""

    def __init__(self, cert_file: Any, key_file: Any, timeout: float) -> None:
        self.paths: list[str] = []

    async def close(self) -> None:
        pass

    async def call(
        self, uuid: str, record: Any, method: str, path: str, **kwargs: Any
    ) -> Any:
        self.paths.append(path)
        return {"path": "/var/lib/trusted-cloud-agent/sealed"}


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
    """The identity quote and U reach an agent directly only with
    ``direct_agents``; a call to the agent's own API (``send-sealed``) must
    not open that path for the rest of the tenant's life."""

    def setUp(self) -> None:
        super().setUp()
        self.useFixture(
            fixtures.MockPatchObject(tenant_mod, "DirectAgents", FakeAgents)
        )

    def _with_record(self, tenant: Tenant) -> object:
        record = object()

        async def identity(uuid: str) -> object:
            return record

        tenant.identity = identity  # type: ignore[method-assign,assignment]
        return record

    def _bootstrap_direct(self, tenant: Tenant, record: object) -> Mapping[str, Any]:
        return _run(tenant._agent(UUID, record, "GET", "/v1/quote"))  # type: ignore[arg-type]

    def test_agent_api_call_first_does_not_open_the_direct_bootstrap_path(
        self,
    ) -> None:
        tenant = _tenant(direct_agents=False)
        record = self._with_record(tenant)
        answer = _run(tenant.agent_request(UUID, "POST", "/v1/sealed", {"blob": ""}))
        self.assertEqual("/var/lib/trusted-cloud-agent/sealed", answer["path"])
        with self.assertRaises(AgentError) as ctx:
            self._bootstrap_direct(tenant, record)
        self.assertIn("through the verifier's relay", str(ctx.exception))
        agents = tenant._agents
        assert isinstance(agents, FakeAgents)
        self.assertEqual(["/v1/sealed"], agents.paths)

    def test_without_direct_agents_the_direct_bootstrap_path_is_refused(
        self,
    ) -> None:
        tenant = _tenant(direct_agents=False)
        with self.assertRaises(AgentError):
            self._bootstrap_direct(tenant, self._with_record(tenant))

    def test_with_direct_agents_the_direct_bootstrap_path_reaches_the_agent(
        self,
    ) -> None:
        tenant = _tenant(direct_agents=True)
        self._bootstrap_direct(tenant, self._with_record(tenant))
        agents = tenant._agents
        assert isinstance(agents, FakeAgents)
        self.assertEqual(["/v1/quote"], agents.paths)
