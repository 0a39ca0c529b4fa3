"""LKH group rekeying: join, batch revocation, member-side checks."""

import dataclasses
import math
import random

import testtools
from cryptography.hazmat.primitives.asymmetric import ed25519

from verifier.protocol.errors import MalformedError
from verifier.protocol.lkh import LkhError, LkhMember, LkhTree, RekeyMessage, Welcome

SIGNER = ed25519.Ed25519PrivateKey.generate()


def _group(n: int, d: int = 4, gid: str = "g") -> tuple[LkhTree, dict[str, LkhMember]]:
    tree = LkhTree(gid, SIGNER, d)
    members: dict[str, LkhMember] = {}
    for i in range(n):
        msg, welcome = tree.join(f"m{i}")
        for m in members.values():
            m.apply(msg)
        members[f"m{i}"] = LkhMember(welcome, SIGNER.public_key(), d)
    return tree, members


class LkhTest(testtools.TestCase):
    def test_joined_members_share_the_group_key(self) -> None:
        tree, members = _group(20)
        for m in members.values():
            self.assertEqual(tree.group_key(), m.group_key())

    def test_revoked_member_is_locked_out_and_others_follow(self) -> None:
        tree, members = _group(20)
        old = tree.group_key()
        msg = RekeyMessage.from_bytes(tree.revoke(["m7"]).to_bytes())
        self.assertNotEqual(old, tree.group_key())
        err = self.assertRaises(LkhError, members.pop("m7").apply, msg)
        self.assertEqual("evicted", err.reason)
        for m in members.values():
            self.assertEqual(tree.group_key(), m.apply(msg))

    def test_revocation_costs_at_most_d_log_n_wrapped_keys(self) -> None:
        for d in (2, 3, 4, 8):
            tree = LkhTree("g", SIGNER, d)
            tree.bulk_add(f"m{i}" for i in range(5000))
            msg = tree.revoke(["m123"])
            bound = d * math.ceil(math.log(5000, d))
            self.assertLessEqual(len(msg.entries), bound, d)

    def test_batch_revocation_shares_path_updates(self) -> None:
        tree = LkhTree("g", SIGNER, 4)
        tree.bulk_add(f"m{i}" for i in range(4096))
        one = len(tree.revoke(["m0"]).entries)
        batch = len(tree.revoke(["m1", "m2", "m3"]).entries)  # same subtree
        self.assertLess(batch, 3 * one)

    def test_random_joins_and_revocations_keep_members_in_step(self) -> None:
        rnd = random.Random(8)
        for d in (2, 3, 5):
            tree, members = _group(5, d)
            for step in range(120):
                if rnd.random() < 0.6:
                    msg, welcome = tree.join(f"n{step}")
                    for m in members.values():
                        self.assertEqual(tree.group_key(), m.apply(msg))
                    members[f"n{step}"] = LkhMember(welcome, SIGNER.public_key(), d)
                elif len(members) > 2:
                    gone = rnd.sample(sorted(members), 2)
                    msg = tree.revoke(gone)
                    for name in gone:
                        self.assertRaises(LkhError, members.pop(name).apply, msg)
                    for m in members.values():
                        self.assertEqual(tree.group_key(), m.apply(msg))

    def test_message_for_another_group_is_rejected(self) -> None:
        tree, members = _group(3)
        other, _ = _group(3, gid="other")
        msg, _ = other.join("x")
        err = self.assertRaises(LkhError, members["m0"].apply, msg)
        self.assertEqual("wrong_group", err.reason)
        self.assertEqual(1, members["m0"].rejected["wrong_group"])

    def test_duplicated_message_is_rejected(self) -> None:
        tree, members = _group(3)
        msg = tree.revoke(["m2"])
        members["m0"].apply(msg)
        err = self.assertRaises(LkhError, members["m0"].apply, msg)
        self.assertEqual("duplicate", err.reason)

    def test_stale_message_is_rejected(self) -> None:
        tree, members = _group(4)
        first = tree.revoke(["m3"])
        second = tree.revoke(["m2"])
        members["m0"].apply(first)
        members["m0"].apply(second)
        err = self.assertRaises(LkhError, members["m0"].apply, first)
        self.assertEqual("stale", err.reason)

    def test_out_of_order_message_is_rejected_and_resync_recovers(self) -> None:
        tree, members = _group(4)
        tree.revoke(["m3"])  # missed by m0
        second = tree.revoke(["m2"])
        m0 = members["m0"]
        err = self.assertRaises(LkhError, m0.apply, second)
        self.assertEqual("gap", err.reason)
        m0.resync(tree.welcome("m0"))  # e.g. after re-attestation
        self.assertEqual(tree.group_key(), m0.group_key())
        msg, _ = tree.join("m9")
        self.assertEqual(tree.group_key(), m0.apply(msg))

    def test_forged_message_is_rejected(self) -> None:
        tree, members = _group(3)
        msg = tree.revoke(["m2"])
        forged = dataclasses.replace(msg, signature=bytes(64))
        err = self.assertRaises(LkhError, members["m0"].apply, forged)
        self.assertEqual("bad_signature", err.reason)

    def test_message_signed_by_another_controller_is_rejected(self) -> None:
        tree, members = _group(3)
        rogue = LkhTree("g", ed25519.Ed25519PrivateKey.generate(), 4)
        rogue.bulk_add(["m0", "m1"])
        rogue.epoch = members["m0"].epoch
        err = self.assertRaises(LkhError, members["m0"].apply, rogue.revoke(["m1"]))
        self.assertEqual("bad_signature", err.reason)

    def test_rejected_message_leaves_member_state_unchanged(self) -> None:
        tree, members = _group(3)
        key = members["m0"].group_key()
        self.assertRaises(LkhError, members["m0"].apply, tree.revoke(["m0"]))
        self.assertEqual(key, members["m0"].group_key())

    def test_truncated_message_is_malformed(self) -> None:
        tree, _ = _group(3)
        raw = tree.revoke(["m1"]).to_bytes()
        self.assertRaises(MalformedError, RekeyMessage.from_bytes, raw[:-70])
        self.assertRaises(MalformedError, RekeyMessage.from_bytes, b"XXXX" + raw[4:])

    def test_welcome_round_trips_and_rejects_bad_keys(self) -> None:
        tree, _ = _group(3)
        welcome = tree.welcome("m1")
        self.assertEqual(welcome, Welcome.from_dict(welcome.to_dict()))
        bad = welcome.to_dict()
        bad["keys"][0][3] = "AAAA"
        self.assertRaises(MalformedError, Welcome.from_dict, bad)
        self.assertRaises(MalformedError, Welcome.from_dict, {"group": "g"})

    def test_joining_twice_is_refused(self) -> None:
        tree, _ = _group(2)
        self.assertRaises(ValueError, tree.join, "m1")
