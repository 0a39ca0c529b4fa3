"""A way back, at the verifier: a node its tenant deleted is enrolled
again (a new V, released after the new enrolment's first good quote) and
the same agent, not restarted, is bootstrapped again through the relay;
an enrolment whose first quote fails answers the tenant's relay with a
409 that names why the node was revoked. The agent is the real
:class:`node_agent.agent.Agent` on a software TPM behind the verifier's
agent stand-in (as in :mod:`test_pull_relay_service`)."""

from __future__ import annotations

import hashlib
import os

from verifier.exceptions import ConflictError
from verifier.protocol import generate_key, seal_payload, seal_share, split
from verifier.protocol.enroller import commit_u
from verifier.protocol.messages.quote import QuoteRequest
from verifier.protocol.messages.shares import ShareU
from verifier.tests.unit.test_pull_relay_service import OWNER, PullRelayBase

SECOND = b"#!/bin/sh\necho again > again\n"


class ReenrolmentServiceTest(PullRelayBase):
    async def _bootstrap(self, key: bytes, u: bytes, payload: bytes) -> None:
        """The tenant's identity check and U through the relay, then V at
        the enrolment's first good quote: the agent is bootstrapped."""
        nk = self._tenant_checks(await self._ask())
        share = ShareU(
            seal_share(nk, u, "U", self.fake.uuid),
            seal_payload(key, payload, self.fake.uuid),
        )
        status = await self.relay.post_u(self.fake.uuid, OWNER, share)
        self.assertEqual("accepted", status.state, status.detail)
        self.assertTrue(await self._deliver_v())
        await self.agent.wait_payload()

    async def test_deleted_node_is_enrolled_again_and_its_agent_bootstrapped_again(
        self,
    ) -> None:
        await self._bootstrap(self.key, self.u, b"#!/bin/sh\necho first > first\n")
        self.assertEqual(
            "attested", (await self.verifier.queries.get(self.fake.uuid)).state
        )
        await self.verifier.commands.delete(self.fake.uuid, OWNER)

        key = generate_key()
        u, v = split(key)
        view = await self.verifier.commands.enrol(
            self.fake.uuid,
            v,
            self.policy,
            project=OWNER,
            u_commitment=commit_u(self.fake.uuid, u),
        )
        self.quiesce(self.verifier)
        self.assertEqual("registered", view.state)
        # the new V (released at the new enrolment's first good quote) and
        # the new U open the new payload: the agent was not restarted
        await self._bootstrap(key, u, SECOND)
        view = await self.verifier.queries.get(self.fake.uuid)
        self.assertEqual("attested", view.state)
        with open(os.path.join(self.agent.work_dir, "again")) as f:
            self.assertEqual("again\n", f.read())
        with open(os.path.join(self.agent.work_dir, "payload"), "rb") as f:
            self.assertEqual(SECOND, f.read())

    async def test_enrolment_whose_first_quote_fails_names_the_reason_in_the_409(
        self,
    ) -> None:
        self.fake.tpm.extend(16, hashlib.sha256(b"rootkit").digest())
        view = await self.verifier.rounds.attest_once(self.fake.uuid)
        self.assertEqual("revoked", view.state)
        with self.assertRaises(ConflictError) as caught:
            await self.relay.ask_identity(
                self.fake.uuid, OWNER, QuoteRequest(os.urandom(20), (16,))
            )
        error = caught.exception
        self.assertEqual(("revoked", 409), (error.code, error.status))
        self.assertIn(f"node {self.fake.uuid} is revoked: pcr_policy: ", error.detail)
        self.assertEqual(
            f"node {self.fake.uuid} is revoked: {view.failure_reason}", error.detail
        )
        with self.assertRaises(ConflictError) as caught:  # U is refused alike
            await self.relay.post_u(self.fake.uuid, OWNER, ShareU(b"TCS1" + bytes(92)))
        self.assertIn("pcr_policy: ", caught.exception.detail)
        self.assertEqual([], self.fake.v_posts)  # V was never released
