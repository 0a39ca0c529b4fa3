"""The shared push store (verifier.attest.push_store, migration 0009):
verifier processes on one database honour each other's push sessions,
and a restarted verifier the sessions and the tenant's relay state of the
one before it. The verifiers are real :class:`Verifier` services on one
SQLite database, each behind its own push endpoint; the agent is the real
:class:`node_agent.push.PushLoop` on a software TPM, moved from one
endpoint to the other."""

from __future__ import annotations

import os

from trusted_testing.lean_serve import LeanTestServer
from verifier.api.push_app import make_push_app
from verifier.attest.service import Verifier
from verifier.attest.settings import VerifierSettings
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
from verifier.protocol.relay import check_identity_answer
from verifier.tests.unit.test_attest_service import VerifierServiceBase

RULES = PushRules(challenge_ttl=10.0, min_gap=1.0, max_evidence_bytes=64 * 1024)
T0 = 1_700_000_000.0
OWNER = "project-a"


class SharedPushStoreTest(VerifierServiceBase):
    async def asyncSetUp(self) -> None:
        from node_agent.agent import Agent, TpmAccess
        from node_agent.evidence import EvidenceReader
        from node_agent.push import PushLoop
        from node_agent.tests.unit.test_agent import SoftTpmAdapter
        from verifier.common.http import AsyncClient

        self.now = T0
        self.fake = self.new_agent()
        self.agent = Agent(
            self.fake.uuid,
            TpmAccess(lambda: SoftTpmAdapter(self.fake.tpm), shared=True),
            os.path.join(self.tmp, "agent"),
        )
        self.http = AsyncClient(None, 10.0)
        self.addAsyncCleanup(self.http.close)
        self.first, url = await self.process()
        self.loop = PushLoop(self.agent, EvidenceReader(None, None), url, self.http)
        self.sessions = 0
        opened = self.loop.open_session

        async def counted() -> None:
            self.sessions += 1
            await opened()

        self.loop.open_session = counted  # type: ignore[method-assign]
        self.key = generate_key()
        self.u, v = split(self.key)
        await self.first.commands.enrol(
            self.fake.uuid, v, self.policy, project=OWNER, mode="push"
        )
        self.quiesce(self.first)

    async def process(self) -> tuple[Verifier, str]:
        """Another verifier process on the same database: its own memory,
        its own push endpoint; it takes up the enrolled nodes (a restart,
        or a process of the same deployment)."""
        verifier = Verifier(
            self.engine,
            self.signing_key,  # the deployment's: one per deployment
            self.registrar,  # type: ignore[arg-type]
            self.agents,  # type: ignore[arg-type]
            Outbox(self.engine, [self.notifier]),
            self.ca,
            VerifierSettings(interval=2.0, push_rules=RULES),
            clock=lambda: self.now,
        )
        self.verifiers.append(verifier)
        await verifier.sync.sync()
        verifier.push.relay.follow_handovers()
        self.quiesce(verifier)
        server = LeanTestServer(make_push_app(verifier.push))
        await server.start_server()
        self.addAsyncCleanup(server.close)
        return verifier, str(server.make_url("/"))

    async def move_to(self, url: str) -> None:
        """The agent's push URL now reaches another process."""
        self.loop.base = f"{url.rstrip('/')}/v1/push/{self.agent.uuid}"

    async def _round(self) -> str:
        self.now += 2.0
        return (await self.loop.round()).state

    async def test_session_opened_at_one_process_is_honoured_by_another(
        self,
    ) -> None:
        self.assertEqual("bootstrapping", await self._round())
        self.assertEqual(1, self.sessions)
        _, url = await self.process()  # a second process, the first still up
        await self.move_to(url)
        self.loop._upcoming = None  # challenges are the issuing process's
        # this process did not send V: it sends it again (the agent says it
        # holds one), then takes the agent's word for it
        self.assertEqual("bootstrapping", await self._round())
        self.assertEqual("attested", await self._round())
        self.assertEqual(1, self.sessions)  # no new session was needed

    async def test_restarted_verifier_keeps_sessions_and_the_tenants_relay(
        self,
    ) -> None:
        nonce = os.urandom(20)
        await self.first.push.relay.ask_identity(
            self.fake.uuid, OWNER, QuoteRequest(nonce, (16,))
        )
        self.first.push.forget(self.fake.uuid)  # the first process goes away
        second, url = await self.process()
        await self.move_to(url)
        self.loop._upcoming = None
        await self._round()  # the ask, loaded from the store, rides along
        relayed = second.push.relay.identity(self.fake.uuid, OWNER, nonce)
        assert relayed.answer is not None
        ak = AttestationKey(self.fake.tpm.ak, True)
        nk = check_identity_answer(relayed.answer, ak, nonce, self.policy)
        envelope = seal_payload(self.key, b"not a script", self.fake.uuid)
        share = ShareU(seal_share(nk, self.u, "U", self.fake.uuid), envelope)
        await second.push.relay.post_u(self.fake.uuid, OWNER, share)
        second.push.forget(self.fake.uuid)  # restarted again before U went out
        third, url = await self.process()
        await self.move_to(url)
        self.loop._upcoming = None
        await self._round()  # U, from the store, rides on the answer
        self.assertTrue(self.agent.bootstrapped)
        await self._round()  # the agent reports it
        status = third.push.relay.u_status(self.fake.uuid, OWNER)
        self.assertEqual(("accepted", True), (status.state, status.bootstrapped))
        self.assertEqual(1, self.sessions)  # one session across both restarts
        self.assertEqual("attested", (await third.queries.get(self.fake.uuid)).state)

    async def test_revoked_node_leaves_nothing_in_the_store(self) -> None:
        await self._round()
        await self.first.push.relay.ask_identity(
            self.fake.uuid, OWNER, QuoteRequest(os.urandom(20), (16,))
        )
        store = self.first.push._store
        assert store is not None
        self.assertIsNotNone(store.relay_state(self.fake.uuid))
        await self.first.commands.revoke(self.fake.uuid, "tenant", "test")
        await self.first.commands.delete(self.fake.uuid)
        self.assertIsNone(store.relay_state(self.fake.uuid))
        from verifier.protocol.push import session_digest

        assert self.loop._token is not None
        self.assertIsNone(store.find_session(session_digest(self.loop._token)))
