"""An enrolment whose first quote fails: the tenant's error names why the
verifier revoked the node (the reason the verifier's 409 carries), not
only that it is revoked."""

from __future__ import annotations

import asyncio
from typing import Any

import testtools

from nova_plugin.exceptions import AttestationFailedError, ServiceError
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
