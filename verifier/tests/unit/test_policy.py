"""PCR policy parsing and matching."""

import json

import testtools

from verifier.protocol import MalformedError, PcrPolicy
from verifier.protocol import tpm as t

A = "aa" * 32
B = "bb" * 32
C = "cc" * 32


class PcrPolicyTest(testtools.TestCase):
    def _malformed(self, data: object) -> MalformedError:
        exc = self.assertRaises(MalformedError, PcrPolicy.from_dict, data)
        self.assertEqual("PCR policy", exc.structure)
        return exc

    def test_list_of_digests(self) -> None:
        policy = PcrPolicy.from_dict({"pcrs": {"16": [A, B], "7": [C]}})
        self.assertEqual(
            {
                16: frozenset({bytes.fromhex(A), bytes.fromhex(B)}),
                7: frozenset({bytes.fromhex(C)}),
            },
            dict(policy.allowed),
        )
        self.assertEqual((7, 16), policy.pcrs)
        self.assertEqual(t.ALG_SHA256, policy.hash_alg)

    def test_single_hex_string(self) -> None:
        policy = PcrPolicy.from_dict({"pcrs": {"16": A}, "hash": "sha256"})
        self.assertEqual({16: frozenset({bytes.fromhex(A)})}, dict(policy.allowed))

    def test_upper_case_hex(self) -> None:
        policy = PcrPolicy.from_dict({"pcrs": {"16": A.upper()}})
        self.assertEqual({16: frozenset({bytes.fromhex(A)})}, dict(policy.allowed))

    def test_non_hex_is_rejected(self) -> None:
        exc = self._malformed({"pcrs": {"16": ["zz" * 32]}})
        self.assertIn("not hex", exc.detail)
        self._malformed({"pcrs": {"16": "a" * 63}})  # odd length

    def test_wrong_length_is_rejected(self) -> None:
        for digest in ("aa" * 31, "aa" * 33, "aa" * 20, ""):
            exc = self._malformed({"pcrs": {"16": [digest]}})
            self.assertIn("expected 32", exc.detail)

    def test_non_string_digest_is_rejected(self) -> None:
        for digests in ([1], [None], [[A]], 16, None, {"a": A}):
            self._malformed({"pcrs": {"16": digests}})

    def test_index_out_of_range_is_rejected(self) -> None:
        for index in ("24", "-1", "100"):
            exc = self._malformed({"pcrs": {index: [A]}})
            self.assertIn("out of range", exc.detail)
        self.assertRaises(MalformedError, PcrPolicy, {24: frozenset({bytes(32)})})

    def test_index_not_a_number_is_rejected(self) -> None:
        for index in ("x", "16.0", ""):
            self._malformed({"pcrs": {index: [A]}})

    def test_non_object_is_rejected(self) -> None:
        for data in (None, [], "pcrs", 16, [("pcrs", {})]):
            self._malformed(data)
        for pcrs in (None, [], [A], "16", 16):
            self._malformed({"pcrs": pcrs})
        self._malformed({})  # no pcrs at all

    def test_empty_list_is_rejected(self) -> None:
        exc = self._malformed({"pcrs": {"16": []}})
        self.assertIn("no allowed values", exc.detail)
        self.assertRaises(MalformedError, PcrPolicy, {16: frozenset()})

    def test_too_many_digests_is_rejected(self) -> None:
        digests = [f"{i:064x}" for i in range(257)]
        self._malformed({"pcrs": {"16": digests}})
        ok = PcrPolicy.from_dict({"pcrs": {"16": digests[:256]}})
        self.assertEqual(256, len(ok.allowed[16]))

    def test_unsupported_hash_is_rejected(self) -> None:
        for name in ("sha1", "SHA256", "sha384", None, 11):
            self._malformed({"pcrs": {"16": A}, "hash": name})

    def test_unhashable_hash_is_rejected(self) -> None:
        # `hash_name not in _HASH_NAMES` raises TypeError for a list/dict.
        for name in (["sha256"], {"sha256": 1}):
            self._malformed({"pcrs": {"16": A}, "hash": name})

    def test_to_dict_round_trip(self) -> None:
        data = {"hash": "sha256", "pcrs": {"7": [C], "16": [B, A]}}
        policy = PcrPolicy.from_dict(data)
        out = policy.to_dict()
        self.assertEqual({"hash": "sha256", "pcrs": {"7": [C], "16": [A, B]}}, out)
        self.assertEqual(policy, PcrPolicy.from_dict(json.loads(json.dumps(out))))

    def test_mismatches(self) -> None:
        policy = PcrPolicy.from_dict({"pcrs": {"16": [A, B], "7": C}})
        a, b, c = bytes.fromhex(A), bytes.fromhex(B), bytes.fromhex(C)
        self.assertEqual([], policy.mismatches({7: c, 16: a}))
        self.assertEqual([], policy.mismatches({7: c, 16: b, 0: a}))
        self.assertEqual([16], policy.mismatches({7: c, 16: c}))
        self.assertEqual([7], policy.mismatches({16: a}))
        self.assertEqual([7, 16], policy.mismatches({}))
        self.assertEqual([7, 16], policy.mismatches({7: a, 16: bytes(32)}))
