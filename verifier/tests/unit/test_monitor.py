"""Monitor attestation (batched quotes of the verifier host): the Merkle
tree, and one named test per attack on the customer's check."""

from __future__ import annotations

import dataclasses
import os

import testtools
from hypothesis import given, settings
from hypothesis import strategies as st

from trusted_testing.softtpm import SoftTpm
from verifier.protocol import (
    AttestationKey,
    EvidenceError,
    MalformedError,
    PcrPolicy,
)
from verifier.protocol.monitor import (
    MerkleTree,
    MonitorAttestation,
    monitor_qualifying_data,
    root_from_path,
    verify_monitor_attestation,
)

PCR = 16


def _nonces(n: int) -> list[bytes]:
    return [os.urandom(20) for _ in range(n)]


class MerkleTreeTest(testtools.TestCase):
    @settings(max_examples=60, deadline=None)
    @given(st.integers(min_value=1, max_value=70))
    def test_every_leaf_path_leads_to_the_root(self, size: int) -> None:
        nonces = _nonces(size)
        tree = MerkleTree(nonces)
        for index, nonce in enumerate(nonces):
            path = tree.path(index)
            self.assertEqual(tree.root, root_from_path(nonce, index, size, path))

    def test_single_nonce_batch_has_an_empty_path(self) -> None:
        (nonce,) = _nonces(1)
        tree = MerkleTree([nonce])
        self.assertEqual((), tree.path(0))
        self.assertEqual(tree.root, root_from_path(nonce, 0, 1, ()))

    def test_path_of_the_wrong_length_is_refused(self) -> None:
        nonces = _nonces(5)
        tree = MerkleTree(nonces)
        path = tree.path(1)
        self.assertRaises(
            MalformedError, root_from_path, nonces[1], 1, 5, path + (bytes(32),)
        )
        self.assertRaises(MalformedError, root_from_path, nonces[1], 1, 5, path[:-1])

    def test_index_outside_the_batch_is_refused(self) -> None:
        nonces = _nonces(4)
        tree = MerkleTree(nonces)
        self.assertRaises(MalformedError, root_from_path, nonces[0], 4, 4, tree.path(0))
        self.assertRaises(IndexError, tree.path, 4)

    def test_bad_nonces_and_empty_batches_are_refused(self) -> None:
        self.assertRaises(MalformedError, MerkleTree, [])
        self.assertRaises(MalformedError, MerkleTree, [b"short"])
        self.assertRaises(MalformedError, MerkleTree, [bytes(65)])

    def test_leaf_and_inner_hashes_are_domain_separated(self) -> None:
        # the root of two leaves, offered as a 64-byte "nonce" of a one-leaf
        # batch, must not reproduce that root
        a, b = _nonces(2)
        tree = MerkleTree([a, b])
        fake = tree.levels[0][0] + tree.levels[0][1]
        self.assertNotEqual(tree.root, root_from_path(fake, 0, 1, ()))


class MonitorAttackTest(testtools.TestCase):
    """The customer's check against a software TPM standing in for the
    verifier host (the functional test uses swtpm)."""

    def setUp(self) -> None:
        super().setUp()
        self.tpm = SoftTpm()
        self.tpm.extend(PCR, b"verifier release 1".ljust(32, b"\0"))
        self.ak = AttestationKey(self.tpm.ak, True)
        self.policy = PcrPolicy.from_dict(
            {"pcrs": {str(PCR): [self.tpm.pcrs[PCR].hex()]}}
        )

    def _batch(self, nonces: list[bytes]) -> list[MonitorAttestation]:
        tree = MerkleTree(nonces)
        quote = self.tpm.quote(monitor_qualifying_data(tree.root, tree.size), (PCR,))
        return [
            MonitorAttestation(quote, i, tree.size, tree.path(i))
            for i in range(tree.size)
        ]

    def _verify(self, att: MonitorAttestation, nonce: bytes, **kw: object) -> object:
        args: dict[str, object] = {"ak": self.ak, "policy": self.policy}
        args.update(kw)
        return verify_monitor_attestation(att, nonce=nonce, **args)  # type: ignore[arg-type]

    def _reason(self, att: MonitorAttestation, nonce: bytes, **kw: object) -> str:
        exc = self.assertRaises(EvidenceError, self._verify, att, nonce, **kw)
        return exc.reason

    def test_every_customer_in_a_batch_verifies(self) -> None:
        nonces = _nonces(9)
        for att, nonce in zip(self._batch(nonces), nonces, strict=True):
            verdict = self._verify(att, nonce)
            self.assertTrue(verdict)

    def test_reply_survives_json_round_trip(self) -> None:
        nonces = _nonces(3)
        att = self._batch(nonces)[2]
        again = MonitorAttestation.from_dict(att.to_dict())
        self.assertEqual(att, again)
        self.assertTrue(self._verify(again, nonces[2]))

    def test_wrong_nonce_is_rejected(self) -> None:
        att = self._batch(_nonces(4))[0]
        self.assertEqual("nonce_not_in_batch", self._reason(att, os.urandom(20)))

    def test_other_customers_reply_is_rejected(self) -> None:
        nonces = _nonces(4)
        replies = self._batch(nonces)
        self.assertEqual("nonce_not_in_batch", self._reason(replies[1], nonces[0]))

    def test_tampered_path_is_rejected(self) -> None:
        nonces = _nonces(6)
        att = self._batch(nonces)[3]
        path = list(att.path)
        path[1] = bytes(b ^ 1 for b in path[1])
        bad = dataclasses.replace(att, path=tuple(path))
        self.assertEqual("nonce_not_in_batch", self._reason(bad, nonces[3]))

    def test_wrong_index_is_rejected(self) -> None:
        nonces = _nonces(4)
        att = self._batch(nonces)[1]
        bad = dataclasses.replace(att, index=0)
        self.assertEqual("nonce_not_in_batch", self._reason(bad, nonces[1]))

    def test_wrong_batch_size_is_rejected(self) -> None:
        # size 8 and size 7 give the leaf 6 the same path shape; the quote
        # binds the size, so a lie about it fails
        nonces = _nonces(8)
        att = self._batch(nonces)[4]
        bad = dataclasses.replace(att, size=7)
        self.assertEqual("nonce_not_in_batch", self._reason(bad, nonces[4]))

    def test_replay_of_an_older_batch_is_rejected(self) -> None:
        old_nonces = _nonces(4)
        old = self._batch(old_nonces)[0]
        fresh = os.urandom(20)
        self.assertEqual("nonce_not_in_batch", self._reason(old, fresh))

    def test_replay_caught_by_tpm_clock_too(self) -> None:
        # a customer that reuses a nonce is still protected by the clock
        nonces = _nonces(2)
        first = self._batch(nonces)[0]
        later_nonces = _nonces(2)
        verdict = verify_monitor_attestation(
            self._batch(later_nonces)[0],
            nonce=later_nonces[0],
            ak=self.ak,
            policy=self.policy,
        )
        self.assertEqual(
            "clock_rollback",
            self._reason(first, nonces[0], previous_clock=verdict.clock),
        )

    def test_quote_by_another_ak_is_rejected(self) -> None:
        nonces = _nonces(3)
        att = self._batch(nonces)[0]
        other = SoftTpm()
        other_ak = AttestationKey(other.ak, True)
        self.assertEqual("signature_invalid", self._reason(att, nonces[0], ak=other_ak))

    def test_quote_by_another_tpm_over_the_same_root_is_rejected(self) -> None:
        nonces = _nonces(3)
        tree = MerkleTree(nonces)
        other = SoftTpm()
        other.pcrs = dict(self.tpm.pcrs)
        quote = other.quote(monitor_qualifying_data(tree.root, tree.size), (PCR,))
        att = MonitorAttestation(quote, 0, tree.size, tree.path(0))
        self.assertEqual("signature_invalid", self._reason(att, nonces[0]))

    def test_tampered_verifier_host_fails_the_pcr_policy(self) -> None:
        self.tpm.extend(PCR, b"rootkit".ljust(32, b"\0"))
        nonces = _nonces(2)
        att = self._batch(nonces)[0]
        self.assertEqual("pcr_policy", self._reason(att, nonces[0]))

    def test_malformed_replies_are_refused(self) -> None:
        nonces = _nonces(2)
        good = self._batch(nonces)[0].to_dict()
        for field, value in (
            ("path", ["zz"]),
            ("path", ["00" * 31]),
            ("path", ["00" * 32] * 21),
            ("index", "0"),
            ("size", None),
        ):
            bad = dict(good, **{field: value})
            self.assertRaises(MalformedError, MonitorAttestation.from_dict, bad)
        self.assertRaises(MalformedError, MonitorAttestation.from_dict, [])
