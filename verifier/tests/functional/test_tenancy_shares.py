"""Share U only from the node's enroller, across projects under a real
Keystone: project beta's U never reaches the bootstrap of a node project
alpha enrolled, and the node still bootstraps with alpha's.

The verifier is the real service behind the real Keystone (tokens of two
projects, :mod:`verifier.tests.functional.tenancy_base`); the node is the
real :class:`node_agent.agent.Agent` on a software TPM, reached by the
verifier through the in-process agent stand-in (quotes from the agent's
TPM over its NK and CSR; V handed to the agent as the verifier sent it).
"""

from __future__ import annotations

import base64
import os

from node_agent.agent import Agent, TpmAccess
from node_agent.exceptions import RefusedError
from node_agent.tests.unit.test_agent import SCRIPT, SoftTpmAdapter
from verifier.protocol import seal_payload, seal_share, split
from verifier.protocol.enroller import commit_u
from verifier.protocol.messages.shares import ShareV
from verifier.tests.functional.tenancy_base import KeystoneTestBase, unittest


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class EnrollerShareTest(KeystoneTestBase):
    async def asyncSetUp(self) -> None:
        await super().asyncSetUp()
        self.node = self.new_agent()
        self.nova.add_server(self.node.uuid, self.project_of("alice"))
        tpm = SoftTpmAdapter(self.node.tpm)
        self.agent = Agent(
            self.node.uuid,
            TpmAccess(lambda: tpm, shared=True),
            os.path.join(self.tmp, "agent"),
            payload_timeout=10,
        )
        # the verifier's quotes come from the agent's TPM over its NK and CSR
        self.node.nk_override = self.agent.nk_public
        self.node.csr_der = self.agent.csr_der

    async def deliver_v(self) -> bool:
        """Attest once; hand the agent the V the verifier sent (if any)."""
        await self.verifier.rounds.attest_once(self.node.uuid)
        if not self.node.v_posts:
            return False
        body = ShareV.from_dict(self.node.v_posts.pop())
        cert = body.identity_cert.encode() if body.identity_cert else None
        return await self.agent.receive_v(body.v, cert, body.u_commitment)

    def share_u(self, u: bytes, key: bytes) -> tuple[bytes, bytes]:
        nk, uuid = self.agent.nk_public, self.node.uuid
        return seal_share(nk, u, "U", uuid), seal_payload(key, SCRIPT, uuid)

    async def enrol_as_alice(self) -> tuple[bytes, bytes]:
        key = os.urandom(32)
        u, v = split(key)
        body = self.enrolment(self.node.uuid, v)
        body["u_commitment"] = _b64(commit_u(self.node.uuid, u))
        body["policy"] = self.policy.to_dict()  # the node's PCR 16
        status, data = await self.call("alice", "POST", "/v1/nodes", body)
        self.assertEqual(201, status, data)
        return u, key

    async def bobs_u(self) -> tuple[bytes, bytes]:
        """Bob (project beta) cannot enrol alice's instance; he picks a U
        and a payload key of his own (he cannot know V)."""
        key = os.urandom(32)
        u, v = split(key)
        body = self.enrolment(self.node.uuid, v)
        body["u_commitment"] = _b64(commit_u(self.node.uuid, u))
        status, data = await self.call("bob", "POST", "/v1/nodes", body)
        self.assertIn(status, (404, 409), data)
        return self.share_u(u, key)

    async def test_other_projects_u_before_v_is_never_combined(self) -> None:
        u, key = await self.enrol_as_alice()
        mine = self.share_u(u, key)
        self.assertFalse(await self.agent.receive_u(*mine, certified=False))
        # the attack: bob's U arrives after alice's, before V
        theirs = await self.bobs_u()
        self.assertFalse(await self.agent.receive_u(*theirs, certified=False))
        self.assertTrue(await self.deliver_v())
        self.assertEqual(3, await self.agent.wait_payload())
        status, view = await self.call("alice", "GET", f"/v1/nodes/{self.node.uuid}")
        self.assertEqual((200, "attested"), (status, view["state"]))

    async def test_other_projects_u_after_v_is_refused(self) -> None:
        u, key = await self.enrol_as_alice()
        self.assertFalse(await self.deliver_v())  # V first, U not there yet
        theirs = await self.bobs_u()
        with self.assertRaises(RefusedError) as refused:
            await self.agent.receive_u(*theirs, certified=False)
        self.assertEqual(
            ("u_not_from_enroller", 403),
            (refused.exception.code, refused.exception.status),
        )
        self.assertFalse(self.agent.bootstrapped)
        self.assertTrue(
            await self.agent.receive_u(*self.share_u(u, key), certified=False)
        )
        self.assertEqual(3, await self.agent.wait_payload())


if __name__ == "__main__":
    unittest.main()
