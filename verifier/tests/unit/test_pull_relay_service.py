"""The relay to polled (pull) nodes in the service (verifier.attest.relay):
the verifier asks the agent for the identity quote over the tenant's
nonce on its own connection, and forwards U sealed to NK to the agent's
``POST /v1/keys/u``, so the tenant needs no route to the node and no
certificate an agent accepts. The agent is the real
:class:`node_agent.agent.Agent` on a software TPM behind the verifier's
agent stand-in. One named test per attack, in pull mode."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from node_agent.agent import Agent, TpmAccess
from node_agent.exceptions import RefusedError
from node_agent.tests.unit.test_agent import SCRIPT, SoftTpmAdapter
from trusted_testing.softtpm import SoftTpm
from verifier.attest.ownership import Ownership
from verifier.attest.service import Verifier
from verifier.attest.settings import VerifierSettings
from verifier.exceptions import AgentUnreachableError, NotFoundError, RequestError
from verifier.notify import Outbox
from verifier.protocol import (
    AttestationKey,
    EnvelopeError,
    bind_nonce,
    generate_key,
    seal_payload,
    seal_share,
    split,
)
from verifier.protocol.enroller import commit_u
from verifier.protocol.messages.quote import QuoteRequest
from verifier.protocol.messages.shares import ShareU, ShareV
from verifier.protocol.relay import RelayError, check_identity_answer
from verifier.tests.unit.test_attest_service import VerifierServiceBase

OWNER, INTRUDER = "project-a", "project-b"


class _OwnsNothing(Ownership):
    """Another verifier process of the deployment: attests none of these."""

    def owns(self, uuid: str) -> bool:
        return False


class PullRelayBase(VerifierServiceBase):
    """A polled node enrolled by ``OWNER``, its real agent, no tests."""

    async def asyncSetUp(self) -> None:
        await super().asyncSetUp()
        self.verifier = self.new_verifier()
        self.fake = self.new_agent()
        self.agent = Agent(
            self.fake.uuid,
            TpmAccess(lambda: SoftTpmAdapter(self.fake.tpm), shared=True),
            os.path.join(self.tmp, "agent"),
            payload_timeout=10,
        )
        # the agent stand-in answers with the real agent's NK, CSR and U
        self.fake.nk_override = self.agent.nk_public
        self.fake.csr_der = self.agent.csr_der
        self.fake.take_u = self._agent_takes_u
        self.relay = self.verifier.push.relay
        self.key = generate_key()
        self.u, v = split(self.key)
        await self.verifier.commands.enrol(
            self.fake.uuid,
            v,
            self.policy,
            project=OWNER,
            u_commitment=commit_u(self.fake.uuid, self.u),
        )
        self.quiesce(self.verifier)

    async def _agent_takes_u(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """POST /v1/keys/u on the real agent, refusals as the client sees them."""
        share = ShareU.from_dict(body)
        try:
            done = await self.agent.receive_u(
                share.u, share.payload, share.payload_id, certified=False
            )
        except (RefusedError, EnvelopeError) as exc:
            raise AgentUnreachableError(f"agent answered 403 to /v1/keys/u: {exc}")
        return {"accepted": "u", "bootstrapped": done}

    async def _ask(self, scope: str | None = OWNER) -> bytes:
        nonce = os.urandom(20)
        await self.relay.ask_identity(self.fake.uuid, scope, QuoteRequest(nonce, (16,)))
        return nonce

    def _tenant_checks(self, nonce: bytes) -> bytes:
        relayed = self.relay.identity(self.fake.uuid, OWNER, nonce)
        assert relayed.answer is not None
        ak = AttestationKey(self.fake.tpm.ak, True)
        return check_identity_answer(relayed.answer, ak, nonce, self.policy)

    def _share(self, nk: bytes, node: str | None = None) -> ShareU:
        node = node or self.fake.uuid
        envelope = seal_payload(self.key, SCRIPT, self.fake.uuid)
        return ShareU(seal_share(nk, self.u, "U", node), envelope)

    async def _deliver_v(self) -> bool:
        await self.verifier.rounds.attest_once(self.fake.uuid)
        body = ShareV.from_dict(self.fake.v_posts.pop())
        cert = body.identity_cert.encode() if body.identity_cert else None
        return await self.agent.receive_v(body.v, cert, body.u_commitment)


class PullRelayServiceTest(PullRelayBase):
    async def test_polled_node_bootstraps_through_the_relay(self) -> None:
        nonce = await self._ask()
        # answered while the tenant waited: the quote over its own nonce
        self.assertEqual(nonce.hex(), self.fake.quote_requests[-1]["nonce"])
        nk = self._tenant_checks(nonce)
        self.assertEqual(self.agent.nk_public, nk)
        status = await self.relay.post_u(self.fake.uuid, OWNER, self._share(nk))
        self.assertEqual(("accepted", False), (status.state, status.bootstrapped))
        self.assertEqual(1, len(self.fake.u_posts))
        self.assertTrue(await self._deliver_v())
        self.assertEqual(3, await self.agent.wait_payload())
        held = self.relay.ledger.u_status(self.fake.uuid, "", None)
        assert held is not None
        self.assertIsNone(held.share.payload)  # nothing kept once accepted
        self.assertNotIn(self.u, held.share.u)  # only ever the envelope

    async def test_node_adopted_while_its_agent_answers_keeps_the_tenants_ask(
        self,
    ) -> None:
        # the quote loop takes the node up (its relay state reloaded from
        # the shared store) while the verifier waits for the agent's
        # identity quote: the answer still meets the tenant's ask (it was a
        # 400 identity_not_asked, seen in a loaded CI run of trusted-nova boot)
        self.relay.follow_handovers()
        self.fake.answer_hook = lambda answer: self.relay.adopted(self.fake.uuid)
        nonce = await self._ask()
        self.assertEqual(self.agent.nk_public, self._tenant_checks(nonce))

    async def test_identity_relay_for_another_projects_polled_node_is_refused(
        self,
    ) -> None:
        asked = len(self.fake.quote_requests)
        with self.assertRaises(RelayError) as caught:
            await self._ask(INTRUDER)
        self.assertEqual("wrong_project", caught.exception.code)
        self.assertEqual(asked, len(self.fake.quote_requests))  # agent not asked
        with self.assertRaises(RelayError) as caught:
            await self.relay.post_u(
                self.fake.uuid, INTRUDER, self._share(self.agent.nk_public)
            )
        self.assertEqual("wrong_project", caught.exception.code)
        self.assertEqual([], self.fake.u_posts)

    async def test_polled_identity_quote_not_over_the_tenants_nonce_is_refused(
        self,
    ) -> None:
        old = os.urandom(20)  # a replay: the node's quote over another nonce
        replay = self.fake.tpm.quote(bind_nonce(old, self.agent.nk_public), (16,))
        self.fake.answer_hook = lambda a: a.update(quote=replay.to_dict())
        nonce = os.urandom(20)
        with self.assertRaises(RelayError) as caught:
            await self.relay.ask_identity(
                self.fake.uuid, OWNER, QuoteRequest(nonce, (16,))
            )
        self.assertEqual("identity_not_over_nonce", caught.exception.code)
        self.assertIsNone(self.relay.identity(self.fake.uuid, OWNER, nonce).answer)

    async def test_polled_identity_quote_not_by_the_nodes_ak_is_refused(
        self,
    ) -> None:
        other = SoftTpm(ak_alg="ecc", ek_alg="ecc")

        def forge(answer: dict[str, Any]) -> None:
            nonce = bytes.fromhex(self.fake.quote_requests[-1]["nonce"])
            bound = bind_nonce(nonce, self.agent.nk_public)
            answer["quote"] = other.quote(bound, (16,)).to_dict()

        self.fake.answer_hook = forge
        nonce = os.urandom(20)
        with self.assertRaises(RelayError) as caught:
            await self.relay.ask_identity(
                self.fake.uuid, OWNER, QuoteRequest(nonce, (16,))
            )
        self.assertEqual("identity_not_over_nonce", caught.exception.code)
        self.assertIsNone(self.relay.identity(self.fake.uuid, OWNER, nonce).answer)

    async def test_polled_u_for_another_node_is_refused_by_the_agent(self) -> None:
        nk = self._tenant_checks(await self._ask())
        other = self.new_agent().uuid
        status = await self.relay.post_u(self.fake.uuid, OWNER, self._share(nk, other))
        self.assertEqual("refused", status.state)
        self.assertIn("does not authenticate", status.detail)
        self.assertFalse(await self._deliver_v())
        self.assertFalse(self.agent.bootstrapped)
        # refused: the tenant may post the right one
        status = await self.relay.post_u(self.fake.uuid, OWNER, self._share(nk))
        self.assertEqual("accepted", status.state)

    async def test_polled_u_posted_twice_is_refused(self) -> None:
        nk = self._tenant_checks(await self._ask())
        await self.relay.post_u(self.fake.uuid, OWNER, self._share(nk))
        with self.assertRaises(RelayError) as caught:
            await self.relay.post_u(self.fake.uuid, OWNER, self._share(nk))
        self.assertEqual("u_already_posted", caught.exception.code)
        self.assertEqual(1, len(self.fake.u_posts))  # the agent got one

    async def test_unreachable_polled_agent_is_a_gateway_error(self) -> None:
        self.fake.unreachable = True
        with self.assertRaises(RequestError) as caught:
            await self._ask()
        self.assertEqual(
            ("agent_unreachable", 502),
            (caught.exception.code, caught.exception.status),
        )
        status = await self.relay.post_u(
            self.fake.uuid, OWNER, self._share(self.agent.nk_public)
        )
        self.assertEqual("refused", status.state)
        self.assertIn("unreachable", status.detail)
        self.fake.unreachable = False  # refused: it may be posted again
        nk = self._tenant_checks(await self._ask())
        status = await self.relay.post_u(self.fake.uuid, OWNER, self._share(nk))
        self.assertEqual("accepted", status.state)

    async def test_any_verifier_process_serves_the_relay_of_a_polled_node(
        self,
    ) -> None:
        other = Verifier(  # a second process on the same database
            self.engine,
            self.signing_key,
            self.registrar,  # type: ignore[arg-type]
            self.agents,  # type: ignore[arg-type]
            Outbox(self.engine, [self.notifier]),
            self.ca,
            VerifierSettings(interval=0.01),
            ownership=_OwnsNothing(),
        )
        self.verifiers.append(other)
        await other.sync.sync()
        self.assertRaises(
            NotFoundError, other.nodes.live, self.fake.uuid
        )  # not its node
        nonce = os.urandom(20)
        await other.push.relay.ask_identity(
            self.fake.uuid, OWNER, QuoteRequest(nonce, (16,))
        )
        nk = self._tenant_checks(nonce)  # read at the attesting process
        status = await self.relay.post_u(self.fake.uuid, OWNER, self._share(nk))
        self.assertEqual("accepted", status.state)
        with self.assertRaises(RelayError) as caught:  # U once, whichever
            await other.push.relay.post_u(self.fake.uuid, OWNER, self._share(nk))
        self.assertEqual("u_already_posted", caught.exception.code)
        self.assertEqual(
            "accepted", other.push.relay.u_status(self.fake.uuid, OWNER).state
        )
        with self.assertRaises(RelayError) as caught:  # still project-scoped
            await other.push.relay.ask_identity(
                self.fake.uuid, INTRUDER, QuoteRequest(nonce, (16,))
            )
        self.assertEqual("wrong_project", caught.exception.code)
        self.assertTrue(await self._deliver_v())
