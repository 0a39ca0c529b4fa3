"""A way back: the same agent bootstrapped again after its node was deleted
and enrolled anew (a new U and V), without a restart. Only a complete pair
whose K opens the new payload replaces the payload in force; one test per
way of trying to disturb it."""

import os

from node_agent.exceptions import RefusedError
from node_agent.tests.unit.test_agent import AgentTestBase
from verifier.ca import CertificateAuthority
from verifier.protocol import seal_payload, seal_share, split
from verifier.protocol.enroller import commit_u


def script(name):
    """A payload that records its run in ``runs`` and exits 0."""
    return f"#!/bin/sh\necho {name} >> runs\necho {name} > marker\n".encode()


class Enrolment:
    """One enrolment's shares as its tenant and verifier send them."""

    def __init__(self, test, plaintext, payload_key=None):
        self.key = key = os.urandom(32)  # the tenant's, to seal more payloads
        u, v = split(key)
        nk, uuid = test.agent.nk_public, test.uuid
        self.u = seal_share(nk, u, "U", uuid)
        self.v = seal_share(nk, v, "V", uuid)
        self.payload = seal_payload(payload_key or key, plaintext, uuid)
        self.commitment = commit_u(uuid, u)


class TestReenrolment(AgentTestBase):
    def setUp(self):
        super().setUp()
        self.first = Enrolment(self, script("one"))
        self.second = Enrolment(self, script("two"))

    async def bootstrap(self, enrolment, cert=None):
        """Both shares (V first, as the verifier releases it after the
        first good quote); returns the payload's exit code."""
        agent = self.agent
        self.assertFalse(await agent.receive_v(enrolment.v, cert, enrolment.commitment))
        self.assertTrue(await agent.receive_u(enrolment.u, enrolment.payload))
        return await agent.wait_payload()

    def read(self, name):
        with open(self.path(name), "rb") as f:
            return f.read()

    def assert_first_in_force(self):
        """The first enrolment's payload is the one installed and it ran
        once; nothing else ran."""
        self.assertTrue(self.agent.bootstrapped)
        self.assertEqual(script("one"), self.read("payload"))
        self.assertEqual(b"one\n", self.read("runs"))

    async def refused(self, coro, code):
        try:
            await coro
        except RefusedError as exc:
            self.assertEqual(code, exc.code)
            return exc
        self.fail(f"not refused ({code} expected)")

    def test_complete_new_pair_replaces_the_payload_and_runs_it_once(self):
        async def go():
            self.assertEqual(0, await self.bootstrap(self.first, self.identity_cert()))
            before = self.agent.bootstrapped_at
            self.assertEqual(0, await self.bootstrap(self.second))
            return before

        before = self.run_async(go())
        self.assertEqual(script("two"), self.read("payload"))
        self.assertEqual(b"one\ntwo\n", self.read("runs"))
        self.assertEqual(b"two\n", self.read("marker"))
        self.assertGreater(self.agent.bootstrapped_at, before)
        self.assertEqual(0, self.agent.payload_exit_code)
        status = self.agent.status()
        self.assertEqual(
            (True, False, False),
            (status["bootstrapped"], status["has_u"], status["has_v"]),
        )
        # the deleted enrolment's identity does not outlive it
        self.assertFalse(os.path.exists(self.path("identity.pem")))
        self.assertFalse(os.path.exists(self.path("identity-key.pem")))

    def test_reenrolment_in_the_other_order_u_then_v(self):
        async def go():
            await self.bootstrap(self.first)
            self.assertFalse(
                await self.agent.receive_u(self.second.u, self.second.payload)
            )
            self.assertTrue(
                await self.agent.receive_v(self.second.v, None, self.second.commitment)
            )
            return await self.agent.wait_payload()

        self.assertEqual(0, self.run_async(go()))
        self.assertEqual(b"one\ntwo\n", self.read("runs"))

    def test_new_u_alone_leaves_the_payload_in_force(self):
        async def go():
            await self.bootstrap(self.first)
            self.assertFalse(
                await self.agent.receive_u(self.second.u, self.second.payload)
            )

        self.run_async(go())
        self.assert_first_in_force()
        self.assertTrue(self.agent.status()["has_u"])
        # in push mode the agent says it lacks the new enrolment's V
        self.assertFalse(self.agent.holds_v)

    def test_new_v_alone_leaves_the_payload_in_force(self):
        async def go():
            await self.bootstrap(self.first)
            self.assertFalse(
                await self.agent.receive_v(self.second.v, None, self.second.commitment)
            )

        self.run_async(go())
        self.assert_first_in_force()
        self.assertTrue(self.agent.status()["has_v"])
        self.assertTrue(self.agent.holds_v)

    def test_pair_whose_key_does_not_open_the_payload_leaves_the_payload_in_force(
        self,
    ):
        # the enroller's U and V, but a payload sealed under another key:
        # its authentication under K = U xor V fails
        forged = Enrolment(self, script("evil"), payload_key=os.urandom(32))

        async def go():
            await self.bootstrap(self.first)
            await self.agent.receive_v(forged.v, None, forged.commitment)
            await self.refused(
                self.agent.receive_u(forged.u, forged.payload), "shares_mismatch"
            )
            self.assert_first_in_force()
            # the V is kept: the enroller's U with the right payload completes
            self.assertTrue(self.agent.status()["has_v"])
            good = seal_payload(forged.key, script("fixed"), self.uuid)
            self.assertTrue(await self.agent.receive_u(forged.u, good))
            return await self.agent.wait_payload()

        self.assertEqual(0, self.run_async(go()))
        self.assertEqual(b"one\nfixed\n", self.read("runs"))

    def test_v_of_another_enrolment_leaves_the_payload_in_force(self):
        stray = Enrolment(self, script("stray"))

        async def go():
            await self.bootstrap(self.first)
            await self.agent.receive_u(self.second.u, self.second.payload)
            # a V that is not the waiting U's other half: K does not open
            # the payload, the V is discarded
            await self.refused(self.agent.receive_v(stray.v, None), "shares_mismatch")
            self.assertFalse(self.agent.status()["has_v"])

        self.run_async(go())
        self.assert_first_in_force()

    def test_foreign_u_after_the_new_v_is_refused_and_changes_nothing(self):
        stranger = Enrolment(self, script("stranger"))

        async def go():
            await self.bootstrap(self.first)
            await self.agent.receive_v(self.second.v, None, self.second.commitment)
            await self.refused(
                self.agent.receive_u(stranger.u, stranger.payload),
                "u_not_from_enroller",
            )
            self.assert_first_in_force()
            self.assertTrue(
                await self.agent.receive_u(self.second.u, self.second.payload)
            )
            await self.agent.wait_payload()

        self.run_async(go())
        self.assertEqual(b"one\ntwo\n", self.read("runs"))

    def test_replayed_old_pair_is_refused_and_nothing_runs_again(self):
        async def go():
            await self.bootstrap(self.first)
            await self.bootstrap(self.second)
            # the first enrolment's shares, replayed: they would put its
            # payload back
            exc = await self.refused(
                self.agent.receive_v(self.first.v, None, self.first.commitment),
                "already_bootstrapped",
            )
            self.assertEqual(409, exc.status)
            exc = await self.refused(
                self.agent.receive_u(self.first.u, self.first.payload),
                "already_bootstrapped",
            )
            self.assertEqual(409, exc.status)

        self.run_async(go())
        self.assertEqual(script("two"), self.read("payload"))
        self.assertEqual(b"one\ntwo\n", self.read("runs"))
        status = self.agent.status()
        self.assertEqual((False, False), (status["has_u"], status["has_v"]))

    def test_same_enrolment_sent_again_is_already_bootstrapped(self):
        async def go():
            await self.bootstrap(self.first)
            await self.refused(
                self.agent.receive_u(self.first.u, self.first.payload),
                "already_bootstrapped",
            )

        self.run_async(go())
        self.assert_first_in_force()

    def test_old_u_with_a_new_v_is_not_the_enrollers(self):
        async def go():
            await self.bootstrap(self.first)
            await self.agent.receive_v(self.second.v, None, self.second.commitment)
            await self.refused(
                self.agent.receive_u(self.first.u, self.first.payload),
                "already_bootstrapped",
            )

        self.run_async(go())
        self.assert_first_in_force()

    def test_run_of_the_old_payload_still_going_is_stopped(self):
        slow = Enrolment(
            self, b"#!/bin/sh\necho slow >> runs\nsleep 30\necho late >> runs\n"
        )

        async def go():
            agent = self.agent
            await agent.receive_v(slow.v, None, slow.commitment)
            await agent.receive_u(slow.u, slow.payload)
            self.assertEqual(0, await self.bootstrap(self.second))

        self.run_async(go())
        runs = self.read("runs")
        self.assertIn(b"two\n", runs)
        self.assertNotIn(b"late", runs)

    def test_new_identity_replaces_the_old_one(self):
        first_cert = self.identity_cert()
        ca = CertificateAuthority.create(os.path.join(self.tmp.name, "ca2"), "CA 2")
        second_cert = ca.sign_csr(self.agent.csr_der, self.uuid)

        async def go():
            await self.bootstrap(self.first, first_cert)
            await self.bootstrap(self.second, second_cert)

        self.run_async(go())
        self.assertEqual(second_cert, self.read("identity.pem"))
