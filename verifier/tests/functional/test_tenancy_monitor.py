"""Monitor attestation (``/v1/monitor/*``) under Keystone tokens.

The verifier host's own TPM (swtpm) answers customers' challenges through
the real monitor routes, behind the real Keystone authenticator and the
policy rule ``attestation:monitor:attest`` (a project's reader or member,
a service, the admin, or a user with the ``monitor`` role). A customer
with a token gets a batch quote it checks itself against the host AK it
fetched; a caller with no token, a token Keystone does not know, or a
role the rule does not name is refused before the host TPM is touched.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import ClassVar

from aiohttp.test_utils import TestServer

from trusted_testing.swtpm import Swtpm, free_port_pair
from verifier.api.monitor_app import add_monitor_routes
from verifier.api.verifier_app import make_app
from verifier.attest.monitor import HostTpm, MonitorBatcher
from verifier.protocol import AttestationKey, PcrPolicy
from verifier.protocol.messages.monitor import MonitorIdentity
from verifier.protocol.monitor import MonitorAttestation, verify_monitor_attestation
from verifier.tests.functional.tenancy_base import KeystoneTestBase, unittest

PCR = 16


class MonitorKeystoneTest(KeystoneTestBase):
    host_tpm: ClassVar[Swtpm]
    _host_dir: ClassVar[str]

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls._host_dir = tempfile.mkdtemp(prefix="monitor-keystone-")
        cls.host_tpm = Swtpm(
            os.path.join(cls._host_dir, "tpm"),
            free_port_pair(),
            os.path.join(cls._host_dir, "localca"),
        )
        try:
            cls.host_tpm.start()
            ks = cls.keystone
            beta = ks.project_id("beta")
            # a provider's monitoring user: only the monitor role
            cls.users["mona"] = ks.add_user("mona", "beta", beta, ["monitor"])
            # a role no rule names
            cls.users["otto"] = ks.add_user("otto", "beta", beta, ["observer"])
            for name in ("mona", "otto"):
                cls.tokens[name] = ks.user_token(cls.users[name])
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls) -> None:
        cls.host_tpm.stop()
        shutil.rmtree(cls._host_dir, ignore_errors=True)
        super().tearDownClass()

    async def asyncSetUp(self) -> None:
        await super().asyncSetUp()
        # the same verifier and authenticator, now with the monitor routes
        await self.server.close()
        self.host = HostTpm(self.host_tpm.tcti, [PCR])
        self.batcher = MonitorBatcher(self.host.quote, 0.005)
        self.batcher.start()

        def monitor_routes(app):  # type: ignore[no-untyped-def]
            add_monitor_routes(app, self.batcher, self.host)

        app = make_app(
            self.verifier,
            "PEM",
            self.auth,
            routes=[monitor_routes],
            instances=self.instances,
        )
        self.server = TestServer(app, host="127.0.0.1")
        await self.server.start_server()

    async def asyncTearDown(self) -> None:
        await self.batcher.stop()
        self.host.close()
        await super().asyncTearDown()

    async def _checked_quote(self, who: str) -> None:
        """``who`` fetches the host AK, challenges with a fresh nonce and
        checks the reply itself."""
        status, body = await self.call(who, "GET", "/v1/monitor/ak")
        self.assertEqual(200, status, body)
        identity = MonitorIdentity.from_dict(body)
        ak = AttestationKey(identity.ak_public, True)
        nonce = os.urandom(32)
        status, body = await self.call(
            who, "POST", "/v1/monitor/attest", {"nonce": nonce.hex()}
        )
        self.assertEqual(200, status, body)
        reply = MonitorAttestation.from_dict(body)
        policy = PcrPolicy.from_dict(
            {"pcrs": {str(PCR): [reply.quote.pcr_values[PCR].hex()]}}
        )
        verdict = verify_monitor_attestation(reply, nonce=nonce, ak=ak, policy=policy)
        self.assertTrue(verdict)
        self.assertEqual([PCR], list(identity.pcrs))

    async def test_project_member_and_reader_check_the_host(self) -> None:
        await self._checked_quote("alice")
        await self._checked_quote("rita")

    async def test_monitor_role_checks_the_host(self) -> None:
        await self._checked_quote("mona")

    async def test_no_token_refused(self) -> None:
        for method, path, body in (
            ("GET", "/v1/monitor/ak", None),
            ("POST", "/v1/monitor/attest", {"nonce": "00" * 32}),
        ):
            status, answer = await self.call(None, method, path, body)
            self.assertEqual(401, status, answer)
        self.assertEqual(0, self.batcher.batches)  # the host TPM never quoted

    async def test_unknown_token_refused(self) -> None:
        status, body = await self.call(
            None, "GET", "/v1/monitor/ak", token="gAAAAAnot-a-keystone-token"
        )
        self.assertEqual(401, status, body)
        self.assertEqual("unauthorized", body["error"]["code"])

    async def test_role_not_in_the_rule_refused(self) -> None:
        status, body = await self.call(
            "otto", "POST", "/v1/monitor/attest", {"nonce": "00" * 32}
        )
        self.assertEqual(403, status, body)
        self.assertEqual(0, self.batcher.batches)

    async def test_bad_nonce_is_a_json_400(self) -> None:
        status, body = await self.call(
            "alice", "POST", "/v1/monitor/attest", {"nonce": "not hex"}
        )
        self.assertEqual(400, status, body)
        self.assertIn("nonce", body["error"]["message"])


if __name__ == "__main__":
    unittest.main()
