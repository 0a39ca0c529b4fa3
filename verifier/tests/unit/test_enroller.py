"""Share U only from the node's enroller (verifier.protocol.enroller): one
test per attack."""

from __future__ import annotations

import os

import testtools

from verifier.protocol import EvidenceError
from verifier.protocol.enroller import (
    COMMITMENT_BYTES,
    MAX_CANDIDATES,
    ShareNotFromEnrollerError,
    TooManySharesError,
    UCandidates,
    check_u,
    commit_u,
)

NODE = "8c0a4a7e-4f3c-4a57-9d1b-2f1e9a0c7b11"
OTHER = "0f7a6c55-2d3e-4b1a-8c9f-6e5d4c3b2a10"


class CommitmentTest(testtools.TestCase):
    def test_enrollers_u_is_accepted(self) -> None:
        u = os.urandom(32)
        commitment = commit_u(NODE, u)
        self.assertEqual(COMMITMENT_BYTES, len(commitment))
        check_u(commitment, NODE, u)  # no error

    def test_another_tenants_u_is_rejected(self) -> None:
        commitment = commit_u(NODE, os.urandom(32))
        exc = self.assertRaises(
            ShareNotFromEnrollerError, check_u, commitment, NODE, os.urandom(32)
        )
        self.assertEqual("u_not_from_enroller", exc.reason)
        self.assertIsInstance(exc, EvidenceError)

    def test_u_committed_for_another_node_is_rejected(self) -> None:
        u = os.urandom(32)
        self.assertRaises(
            ShareNotFromEnrollerError, check_u, commit_u(OTHER, u), NODE, u
        )

    def test_truncated_or_empty_commitment_is_rejected(self) -> None:
        u = os.urandom(32)
        for bad in (b"", commit_u(NODE, u)[:31], commit_u(NODE, u) + b"\0"):
            self.assertRaises(ShareNotFromEnrollerError, check_u, bad, NODE, u)


class CandidatesTest(testtools.TestCase):
    def test_foreign_u_before_v_does_not_replace_the_enrollers(self) -> None:
        mine, theirs = os.urandom(32), os.urandom(32)
        box: UCandidates[str] = UCandidates(NODE)
        box.offer(mine, "mine")
        box.offer(theirs, "theirs")  # the attack: a later U from someone else
        self.assertEqual((mine, "mine"), box.take(commit_u(NODE, mine)))
        self.assertEqual(0, len(box))  # the others are forgotten

    def test_foreign_u_alone_is_never_taken(self) -> None:
        box: UCandidates[str] = UCandidates(NODE)
        box.offer(os.urandom(32), "theirs")
        self.assertIsNone(box.take(commit_u(NODE, os.urandom(32))))
        self.assertEqual(0, len(box))

    def test_flood_of_foreign_u_cannot_push_the_enrollers_out(self) -> None:
        mine = os.urandom(32)
        box: UCandidates[str] = UCandidates(NODE)
        box.offer(mine, "mine")
        for _ in range(MAX_CANDIDATES - 1):
            box.offer(os.urandom(32), "theirs")
        exc = self.assertRaises(
            TooManySharesError, box.offer, os.urandom(32), "one more"
        )
        self.assertEqual("too_many_shares", exc.reason)
        self.assertEqual(MAX_CANDIDATES, len(box))
        self.assertEqual((mine, "mine"), box.take(commit_u(NODE, mine)))

    def test_same_u_again_replaces_its_offer_even_when_full(self) -> None:
        box: UCandidates[str] = UCandidates(NODE, limit=2)
        u = os.urandom(32)
        box.offer(u, "first")
        box.offer(os.urandom(32), "other")
        box.offer(u, "retry")
        self.assertEqual((u, "retry"), box.take(commit_u(NODE, u)))
