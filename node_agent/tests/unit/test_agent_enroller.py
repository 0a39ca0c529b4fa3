"""The agent takes U only from the node's enroller (the U matching the
commitment that comes with V): one test per attack."""

import os

from node_agent.exceptions import RefusedError
from node_agent.tests.unit.test_agent import SCRIPT, AgentTestBase
from verifier.protocol import seal_payload, seal_share, split
from verifier.protocol.enroller import MAX_CANDIDATES, commit_u


class TestEnrollerOnly(AgentTestBase):
    def enrolment(self):
        """(U envelope, V envelope, payload, commitment) of one enroller."""
        key = os.urandom(32)
        u, v = split(key)
        nk = self.agent.nk_public
        return (
            seal_share(nk, u, "U", self.uuid),
            seal_share(nk, v, "V", self.uuid),
            seal_payload(key, SCRIPT, self.uuid),
            commit_u(self.uuid, u),
        )

    def foreign_u(self):
        """Another tenant's U (and payload under its own key): it cannot
        know V, so it picks a U and a key of its own."""
        key = os.urandom(32)
        u, _ = split(key)
        nk = self.agent.nk_public
        return seal_share(nk, u, "U", self.uuid), seal_payload(key, SCRIPT, self.uuid)

    def test_foreign_u_after_enrollers_u_does_not_replace_it(self):
        u_env, v_env, payload, commitment = self.enrolment()
        bad_u, bad_payload = self.foreign_u()

        async def go():
            self.assertFalse(await self.agent.receive_u(u_env, payload))
            # the attack: another tenant's U replaces the pending one
            self.assertFalse(
                await self.agent.receive_u(bad_u, bad_payload, certified=False)
            )
            self.assertTrue(await self.agent.receive_v(v_env, None, commitment))
            return await self.agent.wait_payload()

        self.assertEqual(3, self.run_async(go()))
        self.assertTrue(self.agent.bootstrapped)

    def test_foreign_u_after_v_is_refused_and_the_node_still_bootstraps(self):
        u_env, v_env, payload, commitment = self.enrolment()
        bad_u, bad_payload = self.foreign_u()

        async def go():
            await self.agent.receive_v(v_env, None, commitment)
            try:
                await self.agent.receive_u(bad_u, bad_payload)
            except RefusedError as exc:
                refused = exc
            self.assertFalse(self.agent.bootstrapped)
            self.assertTrue(self.agent.status()["has_v"])  # V is kept
            self.assertTrue(await self.agent.receive_u(u_env, payload))
            await self.agent.wait_payload()
            return refused

        refused = self.run_async(go())
        self.assertEqual(("u_not_from_enroller", 403), (refused.code, refused.status))
        self.assertTrue(self.agent.bootstrapped)

    def test_foreign_u_alone_is_never_combined(self):
        _, v_env, _, commitment = self.enrolment()
        bad_u, bad_payload = self.foreign_u()

        async def go():
            await self.agent.receive_u(bad_u, bad_payload, certified=False)
            return await self.agent.receive_v(v_env, None, commitment)

        self.assertFalse(self.run_async(go()))
        self.assertFalse(self.agent.bootstrapped)
        self.assertIsNone(self.agent.last_error)  # nothing was tried
        self.assertFalse(self.agent.status()["has_u"])  # the foreign U is gone

    def test_flood_of_foreign_u_is_bounded_and_keeps_the_enrollers(self):
        u_env, v_env, payload, commitment = self.enrolment()

        async def go():
            await self.agent.receive_u(u_env, payload)
            for _ in range(MAX_CANDIDATES - 1):
                await self.agent.receive_u(*self.foreign_u(), certified=False)
            try:
                await self.agent.receive_u(*self.foreign_u(), certified=False)
            except RefusedError as exc:
                refused = exc
            self.assertTrue(await self.agent.receive_v(v_env, None, commitment))
            await self.agent.wait_payload()
            return refused

        refused = self.run_async(go())
        self.assertEqual(("too_many_shares", 429), (refused.code, refused.status))

    def test_anonymous_u_is_refused_for_an_enrolment_without_commitment(self):
        u_env, v_env, payload, _ = self.enrolment()

        async def go():
            await self.agent.receive_v(v_env, None)  # an enrolment from before
            await self.agent.receive_u(u_env, payload, certified=False)

        exc = self.assertRaises(RefusedError, self.run_async, go())
        self.assertEqual(("u_not_from_enroller", 403), (exc.code, exc.status))
        self.assertFalse(self.agent.bootstrapped)

    def test_anonymous_u_before_v_without_commitment_is_not_taken(self):
        u_env, v_env, payload, _ = self.enrolment()

        async def go():
            await self.agent.receive_u(u_env, payload, certified=False)
            return await self.agent.receive_v(v_env, None)

        self.assertFalse(self.run_async(go()))
        self.assertFalse(self.agent.bootstrapped)


class TestAnonymousShareU(AgentTestBase):
    """Over HTTP with certificate roles on: U needs no certificate (the
    commitment decides), V still needs the verifier's."""

    enrolment = TestEnrollerOnly.enrolment

    def call(self, path, body):
        import asyncio

        from aiohttp.test_utils import TestClient, TestServer

        from node_agent.server import make_app

        async def go():
            app = make_app(self.agent, {"tenant": ["t"], "verifier": ["v"]})
            async with TestClient(TestServer(app)) as client:
                resp = await client.post(path, json=body)
                return resp.status, await resp.json()

        return asyncio.run(go())

    def test_u_without_certificate_is_taken_as_a_candidate(self):
        import base64

        u_env, _, payload, _ = self.enrolment()
        body = {
            "u": base64.b64encode(u_env).decode(),
            "payload": base64.b64encode(payload).decode(),
        }
        status, data = self.call("/v1/keys/u", body)
        self.assertEqual(
            (200, {"accepted": "u", "bootstrapped": False}), (status, data)
        )
        self.assertTrue(self.agent.status()["has_u"])

    def test_v_without_certificate_is_unauthorized(self):
        import base64

        _, v_env, _, commitment = self.enrolment()
        body = {
            "v": base64.b64encode(v_env).decode(),
            "u_commitment": base64.b64encode(commitment).decode(),
        }
        status, data = self.call("/v1/keys/v", body)
        self.assertEqual((401, "unauthorized"), (status, data["error"]["code"]))
        self.assertFalse(self.agent.status()["has_v"])
