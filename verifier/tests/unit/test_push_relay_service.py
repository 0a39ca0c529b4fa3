"""The relay to push nodes in the service (verifier.attest.relay over
verifier.attest.push), with the real agent's PushLoop on a SoftTpm against
the real push endpoint: the identity quote over the tenant's nonce and U
sealed to NK reach the agent with no connection to it, and what the
verifier holds of U is only the envelope."""

from __future__ import annotations

import os

from trusted_testing.lean_serve import LeanTestServer
from verifier.api.push_app import make_push_app
from verifier.attest.service import Verifier
from verifier.attest.settings import VerifierSettings
from verifier.exceptions import ConflictError, NotFoundError
from verifier.notify import Outbox
from verifier.protocol import (
    AttestationKey,
    generate_key,
    seal_payload,
    seal_share,
    split,
)
from verifier.protocol.messages.quote import QuoteRequest
from verifier.protocol.messages.shares import ShareU
from verifier.protocol.push import PushRules
from verifier.protocol.relay import RelayError, check_identity_answer
from verifier.tests.unit.test_attest_service import VerifierServiceBase

RULES = PushRules(challenge_ttl=10.0, min_gap=1.0, max_evidence_bytes=64 * 1024)
T0 = 1_700_000_000.0
OWNER = "project-a"


class RelayServiceTest(VerifierServiceBase):
    async def asyncSetUp(self) -> None:
        from node_agent.agent import Agent, TpmAccess
        from node_agent.evidence import EvidenceReader
        from node_agent.push import PushLoop
        from node_agent.tests.unit.test_agent import SoftTpmAdapter
        from verifier.common.http import AsyncClient

        self.now = T0
        self.verifier = Verifier(
            self.engine,
            self.signing_key,
            self.registrar,  # type: ignore[arg-type]
            self.agents,  # type: ignore[arg-type]
            Outbox(self.engine, [self.notifier]),
            self.ca,
            VerifierSettings(interval=2.0, push_rules=RULES),
            clock=lambda: self.now,
        )
        self.verifiers.append(self.verifier)
        server = LeanTestServer(make_push_app(self.verifier.push))
        await server.start_server()
        self.addAsyncCleanup(server.close)
        self.fake = self.new_agent()
        self.agent = Agent(
            self.fake.uuid,
            TpmAccess(lambda: SoftTpmAdapter(self.fake.tpm), shared=True),
            os.path.join(self.tmp, "agent"),
        )
        self.http = AsyncClient(None, 10.0)
        self.addAsyncCleanup(self.http.close)
        url = str(server.make_url("/"))
        self.loop = PushLoop(self.agent, EvidenceReader(None, None), url, self.http)
        self.relay = self.verifier.push.relay
        self.key = generate_key()
        self.u, v = split(self.key)
        await self.verifier.commands.enrol(
            self.fake.uuid, v, self.policy, project=OWNER, mode="push"
        )
        self.quiesce(self.verifier)

    async def _round(self) -> str:
        self.now += 2.0
        return (await self.loop.round()).state

    async def _identity(self) -> bytes:
        nonce = os.urandom(20)
        await self.relay.ask_identity(self.fake.uuid, OWNER, QuoteRequest(nonce, (16,)))
        await self._round()
        relayed = self.relay.identity(self.fake.uuid, OWNER, nonce)
        assert relayed.answer is not None
        ak = AttestationKey(self.fake.tpm.ak, True)
        return check_identity_answer(relayed.answer, ak, nonce, self.policy)

    async def test_full_story_through_the_relay(self) -> None:
        nk = await self._identity()
        self.assertEqual(self.agent.nk_public, nk)
        envelope = seal_payload(self.key, b"not a script", self.fake.uuid)
        share = ShareU(seal_share(nk, self.u, "U", self.fake.uuid), envelope)
        self.assertEqual(
            "waiting", (await self.relay.post_u(self.fake.uuid, OWNER, share)).state
        )
        self.assertEqual("attested", await self._round())  # U rides on the answer
        self.assertTrue(self.agent.bootstrapped)
        await self._round()  # the agent reports it
        status = self.relay.u_status(self.fake.uuid, OWNER)
        self.assertEqual("accepted", status.state)
        self.assertEqual([], self.fake.v_posts)  # nothing went to the agent
        held = self.relay.ledger.u_status(self.fake.uuid, "", None)
        assert held is not None
        self.assertIsNone(held.share.payload)
        self.assertNotIn(self.u, held.share.u)  # only the envelope

    async def test_u_for_another_node_is_refused_by_the_agent(self) -> None:
        nk = await self._identity()
        other = self.new_agent().uuid
        share = ShareU(seal_share(nk, self.u, "U", other), b"x" * 40)
        await self.relay.post_u(self.fake.uuid, OWNER, share)
        await self._round()
        await self._round()
        status = self.relay.u_status(self.fake.uuid, OWNER)
        self.assertEqual("refused", status.state)
        self.assertIn("does not authenticate", status.detail)
        self.assertFalse(self.agent.bootstrapped)

    async def test_u_not_decryptable_is_refused_by_the_agent(self) -> None:
        await self._identity()
        garbage = b"TCS1" + os.urandom(92)
        await self.relay.post_u(self.fake.uuid, OWNER, ShareU(garbage, b"x" * 40))
        await self._round()
        await self._round()
        self.assertEqual("refused", self.relay.u_status(self.fake.uuid, OWNER).state)

    async def test_another_project_is_refused_everything(self) -> None:
        request = QuoteRequest(os.urandom(20), (16,))
        with self.assertRaises(RelayError) as caught:
            await self.relay.ask_identity(self.fake.uuid, "project-b", request)
        error = caught.exception
        self.assertEqual("wrong_project", error.code)
        self.assertIsNone(self.relay.carry(self.fake.uuid, "c1"))
        with self.assertRaises(RelayError) as caught:
            await self.relay.post_u(
                self.fake.uuid, "project-b", ShareU(b"TCS1" + bytes(92))
            )
        self.assertEqual("wrong_project", caught.exception.code)

    async def test_unknown_or_revoked_node_has_no_relay(self) -> None:
        request = QuoteRequest(os.urandom(20), (16,))
        with self.assertRaises(NotFoundError):
            await self.relay.ask_identity(self.new_agent().uuid, None, request)
        await self.verifier.commands.revoke(self.fake.uuid, "tenant", "test")
        with self.assertRaises(ConflictError) as caught:
            await self.relay.ask_identity(self.fake.uuid, OWNER, request)
        self.assertEqual("revoked", caught.exception.code)
        # the 409 says why (the stored reason of the revocation)
        self.assertEqual(
            f"node {self.fake.uuid} is revoked: tenant: test", caught.exception.detail
        )
