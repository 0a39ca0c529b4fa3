"""An enrolment whose first quote fails: the tenant's error names why the
verifier revoked the node (the reason the verifier's 409 carries), not
only that it is revoked; a polled node's identity is asked for only once
the verifier has judged its first quote, so the enrolment fails rather
than succeeding for a node revoked a moment later."""

from __future__ import annotations

import asyncio
from typing import Any

import fixtures
import testtools

from nova_plugin.exceptions import AttestationFailedError, ServiceError
from nova_plugin.relay import PushRelay
from nova_plugin.tenant import Tenant, TenantConfig
from nova_plugin.tests.unit.test_tenant import RECORD, REGISTRAR, UUID, VERIFIER
from verifier.protocol import PcrPolicy

REASON = "ima_policy: entry 12 '/usr/bin/x': unknown_file"


class RevokedRelay:
    """The verifier's relay for a node revoked at its first quote."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def call(self, method: str, path: str, body: Any = None) -> Any:
        self.calls.append((method, path))
        url = f"{VERIFIER}{path}"
        raise ServiceError(
            f"{method} {url}: 409 node {UUID} is revoked: {REASON}", 409, "revoked"
        )


class FirstQuoteFailureTest(testtools.TestCase):
    def test_identity_check_after_a_failed_first_quote_names_the_reason(self) -> None:
        session = RevokedRelay()
        config = TenantConfig(REGISTRAR, VERIFIER, None, None, None)
        tenant = Tenant(config, verifier=session, registrar=session)  # type: ignore[arg-type]
        with self.assertRaises(AttestationFailedError) as ctx:
            asyncio.run(
                tenant.check_identity_quote(UUID, RECORD, PcrPolicy({}))  # type: ignore[arg-type]
            )
        message = str(ctx.exception)
        self.assertIn("failed the verifier's attestation", message)
        self.assertIn("nothing was sent", message)
        self.assertIn(REASON, message)
        self.assertEqual(1, len(session.calls))  # no U was sent


class ScriptedVerifier:
    """A verifier whose node is ``registered`` at enrolment, then (after
    ``judged_after`` status reads) in ``then``; its relay refuses a revoked
    node with the verifier's 409."""

    def __init__(self, then: str, judged_after: int = 2) -> None:
        self.then = then
        self.judged_after = judged_after
        self.calls: list[tuple[str, str]] = []

    def call(self, method: str, path: str, body: Any = None) -> Any:
        self.calls.append((method, path))
        if method == "POST" and path == "/v1/nodes":
            return {"uuid": UUID, "state": "registered"}
        if method == "GET" and path == f"/v1/nodes/{UUID}":
            reads = sum(1 for c in self.calls if c == (method, path))
            return {"state": "registered" if reads < self.judged_after else self.then}
        if path.startswith(f"/v1/nodes/{UUID}/relay/") and self.then == "revoked":
            raise ServiceError(
                f"{method} {VERIFIER}{path}: 409 node {UUID} is revoked: {REASON}",
                409,
                "revoked",
            )
        if method == "DELETE":
            return {}
        raise AssertionError(f"unexpected call {method} {path}")


class FirstVerdictTest(testtools.TestCase):
    def _tenant(self, verifier: ScriptedVerifier) -> Tenant:
        config = TenantConfig(REGISTRAR, VERIFIER, None, None, None)
        tenant = Tenant(config, verifier=verifier, registrar=verifier)  # type: ignore[arg-type]

        async def identity(uuid: str) -> Any:
            return RECORD

        self.useFixture(fixtures.MockPatchObject(tenant, "identity", identity))
        return tenant

    def test_a_polled_node_revoked_at_its_first_quote_fails_its_enrolment(
        self,
    ) -> None:
        verifier = ScriptedVerifier("revoked")
        tenant = self._tenant(verifier)
        with self.assertRaises(AttestationFailedError) as ctx:
            asyncio.run(tenant.enrol(UUID, b"payload", PcrPolicy({}), mb_policy="fw"))
        self.assertIn(REASON, str(ctx.exception))
        methods = [m for m, _ in verifier.calls]
        # enrolled; waited for the first verdict; asked; took V back
        self.assertEqual(["POST", "GET", "GET", "POST", "DELETE"], methods)
        self.assertTrue(verifier.calls[3][1].endswith("/relay/identity"))
        self.assertFalse(any(p.endswith("/relay/u") for _, p in verifier.calls))

    def test_first_verdict_returns_the_judged_state(self) -> None:
        verifier = ScriptedVerifier("bootstrapping", judged_after=3)
        relay = PushRelay(_async(verifier), VERIFIER)
        state = asyncio.run(relay.first_verdict(UUID, "registered", 10.0))
        self.assertEqual("bootstrapping", state)
        self.assertEqual(3, len(verifier.calls))

    def test_first_verdict_asks_nothing_of_a_node_judged_already(self) -> None:
        verifier = ScriptedVerifier("revoked")
        relay = PushRelay(_async(verifier), VERIFIER)
        self.assertEqual(
            "attested", asyncio.run(relay.first_verdict(UUID, "attested", 10.0))
        )
        self.assertEqual([], verifier.calls)

    def test_first_verdict_gives_up_after_its_wait(self) -> None:
        # an agent that does not answer keeps its node registered: the
        # enrolment goes on to the identity ask, which says so
        verifier = ScriptedVerifier("revoked", judged_after=10**6)
        relay = PushRelay(_async(verifier), VERIFIER)
        self.assertEqual(
            "registered", asyncio.run(relay.first_verdict(UUID, "registered", 0.2))
        )
        self.assertGreater(len(verifier.calls), 0)


def _async(verifier: ScriptedVerifier) -> Any:
    """The verifier's calls as :class:`PushRelay` makes them (full URLs)."""

    async def call(method: str, url: str, body: Any = None) -> Any:
        return verifier.call(method, url.removeprefix(VERIFIER), body)

    return call
