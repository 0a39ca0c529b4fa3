"""The tenant library without services: what it sends where, and what it
refuses, with in-memory stand-ins for the Keystone session and the agents."""

from __future__ import annotations

import asyncio
from typing import Any

import testtools

from nova_plugin.exceptions import ServiceError
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
