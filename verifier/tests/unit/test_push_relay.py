"""The tenant's relay to its nodes, pure core (verifier.protocol.relay):
one named test per attack -- another project's node, a replayed identity
quote, U for another node or not decryptable, U posted twice or replaced
by another project -- for push nodes (the ask rides on a challenge) and
polled nodes (the verifier fetches the quote at once, under a fetch id of
its own), and the tenant's own identity check, which is the same on the
direct and the relayed path."""

from __future__ import annotations

import hashlib
import os

import testtools

from trusted_testing.softtpm import SoftTpm
from verifier.protocol import (
    AttestationKey,
    EnvelopeError,
    EvidenceError,
    MalformedError,
    PcrPolicy,
    bind_nonce,
    open_share,
    seal_share,
)
from verifier.protocol.messages.push import ChallengeMessage, EvidencePost, UOutcome
from verifier.protocol.messages.quote import QuoteAnswer, QuoteRequest
from verifier.protocol.messages.relay import IdentityAsk, IdentityRelayed, URelayStatus
from verifier.protocol.messages.shares import ShareU
from verifier.protocol.relay import RelayError, RelayLedger, check_identity_answer

NODE = "6f1d7a2e-0f4b-4c1e-9a57-1d2e3f405161"
OTHER = "0a6b2c8d-3e4f-4a5b-8c6d-7e8f90a1b2c3"
OWNER, INTRUDER = "project-a", "project-b"
NOW = 1_700_000_000.0
PCR16 = hashlib.sha256(b"trusted boot chain").digest()


def _nk() -> tuple[object, bytes]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import x25519

    key = x25519.X25519PrivateKey.generate()
    raw = serialization.Encoding.Raw, serialization.PublicFormat.Raw
    return key, key.public_key().public_bytes(*raw)


class RelayBase(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.ledger = RelayLedger(ask_ttl=60.0)
        self.tpm = SoftTpm()
        self.tpm.extend(16, PCR16)
        self.ak = AttestationKey(self.tpm.ak, activated=True)
        self.policy = PcrPolicy({16: frozenset({self.tpm.pcrs[16]})})
        self.nk_private, self.nk = _nk()

    def _answer(self, nonce: bytes, tpm: SoftTpm | None = None) -> QuoteAnswer:
        quote = (tpm or self.tpm).quote(bind_nonce(nonce, self.nk), (16,))
        return QuoteAnswer(quote, self.nk)

    def _refused(self, code: str, call: object, *args: object) -> None:
        error = self.assertRaises(RelayError, call, *args)  # type: ignore[arg-type]
        self.assertEqual(code, error.code)


class TestIdentityRelay(RelayBase):
    def _ask(self) -> bytes:
        nonce = os.urandom(20)
        self.ledger.ask_identity(NODE, OWNER, OWNER, QuoteRequest(nonce, (16,)), NOW)
        return nonce

    def test_tenant_gets_the_quote_over_its_nonce_and_checks_it_itself(self) -> None:
        nonce = self._ask()
        carried = self.ledger.carry(NODE, "c1", NOW + 1)
        assert carried is not None
        self.assertEqual(nonce, carried.nonce)
        self.assertIsNone(self.ledger.identity(NODE, OWNER, OWNER, nonce))
        self.ledger.answer_identity(NODE, "c1", self.ak, self._answer(nonce))
        answer = self.ledger.identity(NODE, OWNER, OWNER, nonce)
        assert answer is not None
        self.assertEqual(
            self.nk, check_identity_answer(answer, self.ak, nonce, self.policy)
        )
        # answered: later challenges carry nothing
        self.assertIsNone(self.ledger.carry(NODE, "c2", NOW + 2))

    def test_identity_ask_for_another_projects_node_is_refused(self) -> None:
        request = QuoteRequest(os.urandom(20), (16,))
        self._refused(
            "wrong_project",
            self.ledger.ask_identity,
            NODE,
            OWNER,
            INTRUDER,
            request,
            NOW,
        )
        self.assertIsNone(self.ledger.carry(NODE, "c1", NOW))

    def test_another_project_cannot_fetch_the_identity_answer(self) -> None:
        nonce = self._ask()
        self.ledger.carry(NODE, "c1", NOW)
        self.ledger.answer_identity(NODE, "c1", self.ak, self._answer(nonce))
        self._refused(
            "wrong_project", self.ledger.identity, NODE, OWNER, INTRUDER, nonce
        )

    def test_operator_scope_may_relay_for_any_project(self) -> None:
        request = QuoteRequest(os.urandom(20), (16,))
        self.ledger.ask_identity(NODE, OWNER, None, request, NOW)
        self.assertIsNotNone(self.ledger.carry(NODE, "c1", NOW))

    def test_identity_quote_not_over_the_tenants_nonce_is_refused(self) -> None:
        # a replay: the node's quote over an older nonce
        old = os.urandom(20)
        nonce = self._ask()
        self.ledger.carry(NODE, "c1", NOW)
        self._refused(
            "identity_not_over_nonce",
            self.ledger.answer_identity,
            NODE,
            "c1",
            self.ak,
            self._answer(old),
        )
        self.assertIsNone(self.ledger.identity(NODE, OWNER, OWNER, nonce))
        # the right quote is still taken afterwards
        self.ledger.answer_identity(NODE, "c1", self.ak, self._answer(nonce))
        self.assertIsNotNone(self.ledger.identity(NODE, OWNER, OWNER, nonce))

    def test_identity_quote_by_another_tpm_is_refused(self) -> None:
        nonce = self._ask()
        self.ledger.carry(NODE, "c1", NOW)
        forged = self._answer(nonce, SoftTpm())
        self._refused(
            "identity_not_over_nonce",
            self.ledger.answer_identity,
            NODE,
            "c1",
            self.ak,
            forged,
        )

    def test_identity_quote_that_does_not_parse_is_refused(self) -> None:
        self._ask()
        self.ledger.carry(NODE, "c1", NOW)
        self._refused(
            "identity_not_over_nonce",
            self.ledger.answer_identity,
            NODE,
            "c1",
            self.ak,
            {"quote": "nonsense"},
        )

    def test_identity_quote_for_a_challenge_that_carried_no_ask_is_refused(
        self,
    ) -> None:
        nonce = self._ask()
        self.ledger.carry(NODE, "c1", NOW)
        self._refused(
            "identity_not_asked",
            self.ledger.answer_identity,
            NODE,
            "c0",
            self.ak,
            self._answer(nonce),
        )
        self._refused(
            "identity_not_asked",
            self.ledger.answer_identity,
            OTHER,
            "c1",
            self.ak,
            self._answer(nonce),
        )

    def test_fetching_with_another_nonce_is_refused(self) -> None:
        self._ask()
        self._refused(
            "not_asked", self.ledger.identity, NODE, OWNER, OWNER, os.urandom(20)
        )

    def test_expired_ask_is_not_carried(self) -> None:
        self._ask()
        self.assertIsNone(self.ledger.carry(NODE, "c1", NOW + 61))


class TestPullRelay(RelayBase):
    """A polled node: the verifier carries the ask on a fetch of its own
    (``carry`` with its fetch id), asks the agent and hands the answer to
    the same ledger checks."""

    FETCH = "pull-0001"

    def _fetch(self, scope: str | None = OWNER) -> bytes:
        nonce = os.urandom(20)
        self.ledger.ask_identity(NODE, OWNER, scope, QuoteRequest(nonce, (16,)), NOW)
        carried = self.ledger.carry(NODE, self.FETCH, NOW)
        assert carried is not None and carried.nonce == nonce
        return nonce

    def test_pull_relay_for_another_projects_node_is_refused(self) -> None:
        self._refused(
            "wrong_project",
            self._fetch,
            INTRUDER,
        )
        self.assertIsNone(self.ledger.carry(NODE, self.FETCH, NOW))
        self._refused(
            "wrong_project", self.ledger.post_u, NODE, OWNER, INTRUDER, self._share()
        )

    def test_pull_quote_not_over_the_tenants_nonce_is_refused(self) -> None:
        nonce = self._fetch()
        replay = self._answer(os.urandom(20))
        self._refused(
            "identity_not_over_nonce",
            self.ledger.answer_identity,
            NODE,
            self.FETCH,
            self.ak,
            replay,
        )
        self.assertIsNone(self.ledger.identity(NODE, OWNER, OWNER, nonce))

    def test_pull_quote_not_by_the_nodes_ak_is_refused(self) -> None:
        nonce = self._fetch()
        forged = self._answer(nonce, SoftTpm())
        self._refused(
            "identity_not_over_nonce",
            self.ledger.answer_identity,
            NODE,
            self.FETCH,
            self.ak,
            forged,
        )
        self.assertIsNone(self.ledger.identity(NODE, OWNER, OWNER, nonce))

    def test_pull_quote_for_another_fetch_is_refused(self) -> None:
        nonce = self._fetch()
        self._refused(
            "identity_not_asked",
            self.ledger.answer_identity,
            NODE,
            "pull-other",
            self.ak,
            self._answer(nonce),
        )

    def test_pull_u_for_another_node_does_not_open_on_this_node(self) -> None:
        other = self._share(OTHER)
        self.ledger.post_u(NODE, OWNER, OWNER, other)
        handed = self.ledger.deliver_u(NODE)
        assert handed is not None
        self.assertRaises(
            EnvelopeError, open_share, self.nk_private, handed.u, "U", NODE
        )
        # the agent refuses it: the tenant may post again
        self.ledger.u_outcome(NODE, False, "share U does not authenticate", False)
        self.ledger.post_u(NODE, OWNER, OWNER, self._share())

    def test_pull_u_posted_twice_is_refused(self) -> None:
        self.ledger.post_u(NODE, OWNER, OWNER, self._share())
        self.assertIsNotNone(self.ledger.deliver_u(NODE))
        self.ledger.u_outcome(NODE, True, "", False)
        self._refused(
            "u_already_posted", self.ledger.post_u, NODE, OWNER, OWNER, self._share()
        )

    def _share(self, uuid: str = NODE) -> ShareU:
        return ShareU(seal_share(self.nk, os.urandom(32), "U", uuid), b"sealed payload")


class TestRelayExport(RelayBase):
    """What the shared store keeps of a node's relay, and reads back."""

    def test_export_and_load_round_trip(self) -> None:
        nonce = os.urandom(20)
        self.ledger.ask_identity(NODE, OWNER, OWNER, QuoteRequest(nonce, (16,)), NOW)
        self.ledger.carry(NODE, "c1", NOW)
        self.ledger.answer_identity(NODE, "c1", self.ak, self._answer(nonce))
        share = ShareU(seal_share(self.nk, os.urandom(32), "U", NODE), b"payload")
        self.ledger.post_u(NODE, OWNER, OWNER, share)
        self.ledger.deliver_u(NODE)
        exported = self.ledger.export(NODE)
        assert exported is not None
        other = RelayLedger()
        other.load(NODE, exported)
        self.assertEqual(
            self.ledger.identity(NODE, OWNER, OWNER, nonce),
            other.identity(NODE, OWNER, OWNER, nonce),
        )
        self.assertEqual(share, other.deliver_u(NODE))
        self.assertIsNone(other.export(OTHER))

    def test_load_of_something_else_raises_malformed(self) -> None:
        for bad in ({"ask": {"nonce": "zz"}}, {"u": {"state": "lost"}}, {"u": 3}):
            self.assertRaises(MalformedError, self.ledger.load, NODE, bad)
        self.assertIsNone(self.ledger.export(NODE))


class TestTenantIdentityCheck(RelayBase):
    """check_identity_answer: what the tenant runs on either path."""

    def test_replayed_identity_quote_fails_the_tenants_check(self) -> None:
        answer = self._answer(os.urandom(20))
        error = self.assertRaises(
            EvidenceError,
            check_identity_answer,
            answer,
            self.ak,
            os.urandom(20),
            self.policy,
        )
        self.assertEqual("nonce_mismatch", error.reason)

    def test_pcrs_off_policy_fail_the_tenants_check(self) -> None:
        nonce = os.urandom(20)
        self.tpm.extend(16, b"\x01" * 32)
        self.assertRaises(
            EvidenceError,
            check_identity_answer,
            self._answer(nonce),
            self.ak,
            nonce,
            self.policy,
        )

    def test_a_malformed_answer_fails_the_tenants_check(self) -> None:
        self.assertRaises(
            MalformedError,
            check_identity_answer,
            {"nk": 1},
            self.ak,
            b"n" * 20,
            self.policy,
        )


class TestURelay(RelayBase):
    def _share(self, uuid: str = NODE) -> ShareU:
        return ShareU(seal_share(self.nk, os.urandom(32), "U", uuid), b"sealed payload")

    def test_u_is_delivered_opaque_until_the_agent_reports(self) -> None:
        share = self._share()
        self.ledger.post_u(NODE, OWNER, OWNER, share)
        self.assertEqual(share, self.ledger.deliver_u(NODE))
        self.assertEqual(share, self.ledger.deliver_u(NODE))  # an answer was lost
        self.ledger.u_outcome(NODE, True, "", True)
        self.assertIsNone(self.ledger.deliver_u(NODE))
        held = self.ledger.u_status(NODE, OWNER, OWNER)
        assert held is not None
        self.assertEqual(("accepted", True), (held.state, held.bootstrapped))
        self.assertIsNone(held.share.payload)  # nothing kept longer than needed

    def test_u_posted_twice_is_refused(self) -> None:
        first = self._share()
        self.ledger.post_u(NODE, OWNER, OWNER, first)
        self._refused(
            "u_already_posted", self.ledger.post_u, NODE, OWNER, OWNER, self._share()
        )
        self.assertEqual(first, self.ledger.deliver_u(NODE))

    def test_u_replaced_by_another_project_is_refused(self) -> None:
        first = self._share()
        self.ledger.post_u(NODE, OWNER, OWNER, first)
        self._refused(
            "wrong_project", self.ledger.post_u, NODE, OWNER, INTRUDER, self._share()
        )
        self.assertEqual(first, self.ledger.deliver_u(NODE))

    def test_u_for_another_projects_node_is_refused(self) -> None:
        self._refused(
            "wrong_project", self.ledger.post_u, NODE, OWNER, INTRUDER, self._share()
        )
        self.assertIsNone(self.ledger.deliver_u(NODE))
        self._refused("wrong_project", self.ledger.u_status, NODE, OWNER, INTRUDER)

    def test_u_that_is_no_share_envelope_is_refused(self) -> None:
        self._refused(
            "u_malformed",
            self.ledger.post_u,
            NODE,
            OWNER,
            OWNER,
            ShareU(os.urandom(96)),
        )

    def test_u_for_another_node_does_not_open_on_this_node(self) -> None:
        # the verifier cannot tell (U is opaque to it); the AEAD binds the
        # node's UUID, so the agent refuses and reports it
        share = self._share(OTHER)
        self.ledger.post_u(NODE, OWNER, OWNER, share)
        delivered = self.ledger.deliver_u(NODE)
        assert delivered is not None
        self.assertRaises(
            EnvelopeError, open_share, self.nk_private, delivered.u, "U", NODE
        )
        self.ledger.u_outcome(NODE, False, "share U does not authenticate", False)
        held = self.ledger.u_status(NODE, OWNER, OWNER)
        assert held is not None
        self.assertEqual("refused", held.state)
        # a refused U may be replaced, by its project only
        self._refused(
            "wrong_project", self.ledger.post_u, NODE, OWNER, INTRUDER, self._share()
        )
        self.ledger.post_u(NODE, OWNER, OWNER, self._share())

    def test_outcome_without_delivery_is_ignored(self) -> None:
        self.ledger.post_u(NODE, OWNER, OWNER, self._share())
        self.ledger.u_outcome(NODE, True, "", False)  # not delivered yet
        held = self.ledger.u_status(NODE, OWNER, OWNER)
        assert held is not None
        self.assertEqual("waiting", held.state)

    def test_forget_drops_everything(self) -> None:
        self.ledger.post_u(NODE, OWNER, OWNER, self._share())
        self.ledger.forget(NODE)
        self.assertIsNone(self.ledger.deliver_u(NODE))


class TestRelayMessages(testtools.TestCase):
    def test_messages_round_trip(self) -> None:
        request = QuoteRequest(os.urandom(20), (10, 16))
        self.assertEqual(
            request, IdentityAsk.from_dict(IdentityAsk(request).to_dict()).request
        )
        relayed = IdentityRelayed({"quote": {}})
        self.assertEqual(relayed, IdentityRelayed.from_dict(relayed.to_dict()))
        status = URelayStatus("refused", "bad", False)
        self.assertEqual(status, URelayStatus.from_dict(status.to_dict()))
        challenge = ChallengeMessage(
            "c1", request, NOW, QuoteRequest(os.urandom(20), (16,))
        )
        self.assertEqual(challenge, ChallengeMessage.from_dict(challenge.to_dict()))
        post = EvidencePost("c1", {"a": 1}, {"b": 2}, UOutcome(False, False, "no"))
        self.assertEqual(post, EvidencePost.from_dict(post.to_dict()))

    def test_malformed_relay_messages_raise_the_projects_errors(self) -> None:
        for bad in (None, [], {"nonce": "zz", "pcrs": [16]}, {"nonce": "00" * 20}):
            self.assertRaises(MalformedError, IdentityAsk.from_dict, bad)
        for bad in ({"state": "answered"}, {"state": "x", "answer": None}):
            self.assertRaises(MalformedError, IdentityRelayed.from_dict, bad)
        self.assertRaises(MalformedError, URelayStatus.from_dict, {"state": "lost"})
        self.assertRaises(
            MalformedError,
            EvidencePost.from_dict,
            {"challenge": "c", "evidence": {}, "identity": 3},
        )
        self.assertRaises(
            MalformedError,
            EvidencePost.from_dict,
            {"challenge": "c", "evidence": {}, "u_outcome": {"accepted": "yes"}},
        )
