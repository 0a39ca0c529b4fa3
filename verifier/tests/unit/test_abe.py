"""CP-ABE (BSW07 / BLS12-381) and hybrid policy sealing."""

import dataclasses
import os

import hypothesis
import pymcl
import testtools
from hypothesis import strategies as st

from verifier.protocol.abe import (
    AbeError,
    Ciphertext,
    MasterKey,
    PolicyError,
    PublicParams,
    SealIntegrityError,
    SecretKey,
    decrypt,
    encapsulate,
    encrypt,
    keygen,
    satisfies,
    seal,
    setup,
    unseal,
)
from verifier.protocol.errors import EnvelopeError, MalformedError, ProtocolError

PP, MSK = setup()
UNIVERSE = ["region=eu", "region=eu-west", "hv=kvm-9.2", "hv=kvm-9", "tpm", "a=1"]
SETTINGS = hypothesis.settings(max_examples=40, deadline=None)


def _policies() -> st.SearchStrategy[str]:
    leaf = st.sampled_from(UNIVERSE)

    def extend(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        lists = st.lists(children, min_size=1, max_size=3)
        return st.one_of(
            lists.map(lambda xs: "(" + " and ".join(xs) + ")"),
            lists.map(lambda xs: "(" + " or ".join(xs) + ")"),
            lists.flatmap(
                lambda xs: st.integers(1, len(xs)).map(
                    lambda k: f"{k} of ({', '.join(xs)})"
                )
            ),
        )

    return st.recursive(leaf, extend, max_leaves=8)


def _random_gt() -> pymcl.GT:
    return pymcl.pairing(pymcl.g1, pymcl.g2) ** pymcl.Fr.random()


class SealTest(testtools.TestCase):
    @SETTINGS
    @hypothesis.given(
        _policies(), st.sets(st.sampled_from(UNIVERSE), min_size=1), st.binary()
    )
    def test_unseal_succeeds_iff_policy_satisfied(
        self, policy: str, attrs: set[str], payload: bytes
    ) -> None:
        blob = seal(PP, policy, payload, aad=b"ctx")
        sk = keygen(MSK, attrs)
        if satisfies(policy, attrs):
            self.assertEqual(payload, unseal(PP, sk, blob, aad=b"ctx"))
        else:
            exc = self.assertRaises(AbeError, unseal, PP, sk, blob, aad=b"ctx")
            self.assertIn("do not satisfy", str(exc))

    def test_issue_example(self) -> None:
        policy = "region=eu and (hv=kvm-9 or hv=xen-4.5)"
        blob = seal(PP, policy, b"secret")
        # A node booted later, with a key issued after sealing, opens it.
        later = keygen(MSK, ["region=eu", "hv=xen-4.5", "tpm"])
        self.assertEqual(b"secret", unseal(PP, later, blob))
        for attrs in (["region=eu", "hv=kvm-9.2"], ["region=eu-west", "hv=kvm-9"]):
            self.assertRaises(AbeError, unseal, PP, keygen(MSK, attrs), blob)

    def test_wrong_aad_fails(self) -> None:
        blob = seal(PP, "tpm", b"x", aad=b"one")
        sk = keygen(MSK, ["tpm"])
        exc = self.assertRaises(SealIntegrityError, unseal, PP, sk, blob, aad=b"two")
        self.assertIsInstance(exc, EnvelopeError)

    def test_any_modified_byte_fails(self) -> None:
        # "or": the opener uses one leaf, yet a flip in the other still fails.
        policy = "tpm or (region=eu and 2 of (a=1, hv=kvm-9, hv=kvm-9.2))"
        blob = seal(PP, policy, b"payload bytes")
        sk = keygen(MSK, ["tpm"])
        self.assertEqual(b"payload bytes", unseal(PP, sk, blob))
        positions = set(range(0, len(blob), max(1, len(blob) // 150)))
        positions |= {len(blob) - 1, len(blob) - 17, 5, 6}
        for pos in sorted(positions):
            for mask in (0x01, 0x80):
                bad = bytearray(blob)
                bad[pos] ^= mask
                self.assertRaises(ProtocolError, unseal, PP, sk, bytes(bad))

    def test_truncated_blob_is_malformed(self) -> None:
        blob = seal(PP, "tpm and region=eu", b"payload")
        sk = keygen(MSK, ["tpm", "region=eu"])
        for n in (0, 3, 7, 8, 50, len(blob) // 2, len(blob) - 1):
            exc = self.assertRaises(MalformedError, unseal, PP, sk, blob[:n])
            self.assertIn("malformed", str(exc))
        self.assertRaises(MalformedError, unseal, PP, sk, blob + b"\x00")

    def test_key_for_other_public_parameters(self) -> None:
        pp2, msk2 = setup()
        blob = seal(PP, "tpm", b"x")
        exc = self.assertRaises(AbeError, unseal, PP, keygen(msk2, ["tpm"]), blob)
        self.assertEqual("key is for other public parameters", str(exc))
        exc = self.assertRaises(AbeError, unseal, pp2, keygen(msk2, ["tpm"]), blob)
        self.assertIn("ciphertext is for other public parameters", str(exc))

    def test_bad_policy_on_seal(self) -> None:
        exc = self.assertRaises(PolicyError, seal, PP, "region=eu and", b"x")
        self.assertEqual(13, exc.position)

    def test_bad_attribute_on_keygen(self) -> None:
        self.assertRaises(PolicyError, keygen, MSK, ["hv=kvm 9"])
        self.assertRaises(PolicyError, keygen, MSK, ["région=eu"])
        self.assertRaises(AbeError, keygen, MSK, [])
        self.assertRaises(AbeError, keygen, MSK, "tpm")

    def test_similar_attributes_are_distinct(self) -> None:
        blob = seal(PP, "hv=kvm-9.2", b"x")
        self.assertRaises(AbeError, unseal, PP, keygen(MSK, ["hv=kvm-9"]), blob)
        self.assertEqual(b"x", unseal(PP, keygen(MSK, ["hv=kvm-9.2"]), blob))

    def test_large_payload(self) -> None:
        payload = os.urandom(1 << 20)
        blob = seal(PP, "tpm", payload)
        self.assertEqual(payload, unseal(PP, keygen(MSK, ["tpm"]), blob))


class CollusionTest(testtools.TestCase):
    """Two nodes, each missing a different attribute of ``a and b``."""

    def setUp(self) -> None:
        super().setUp()
        self.policy = "tpm=a and tpm=b"
        self.m = _random_gt()
        self.ct = encrypt(PP, self.m, self.policy)
        self.blob = seal(PP, self.policy, b"secret")
        self.ka = keygen(MSK, ["tpm=a", "x"])
        self.kb = keygen(MSK, ["tpm=b", "x"])

    def test_each_alone_fails(self) -> None:
        for sk in (self.ka, self.kb):
            self.assertRaises(AbeError, decrypt, PP, sk, self.ct)
            self.assertRaises(AbeError, unseal, PP, sk, self.blob)

    def test_mixed_components_do_not_decrypt(self) -> None:
        for base in (self.ka, self.kb):
            merged = SecretKey(
                base.pp_id, base.d, {**self.ka.components, **self.kb.components}
            )
            self.assertNotEqual(self.m, decrypt(PP, merged, self.ct))
            self.assertRaises(SealIntegrityError, unseal, PP, merged, self.blob)

    def test_merged_serialized_key_does_not_decrypt(self) -> None:
        merged = SecretKey(
            self.ka.pp_id, self.ka.d, {**self.ka.components, **self.kb.components}
        )
        again = SecretKey.from_bytes(merged.to_bytes())
        self.assertRaises(SealIntegrityError, unseal, PP, again, self.blob)


class SchemeTest(testtools.TestCase):
    def test_encrypt_decrypt_threshold(self) -> None:
        m = _random_gt()
        ct = encrypt(PP, m, "2 of (a, b, c) and (d or 2 of (e, f, g))")
        self.assertEqual(m, decrypt(PP, keygen(MSK, ["a", "c", "f", "g"]), ct))
        self.assertRaises(AbeError, decrypt, PP, keygen(MSK, ["a", "f", "g"]), ct)

    def test_decrypt_needs_a_message(self) -> None:
        _, ct = encapsulate(PP, "a")
        self.assertRaises(AbeError, decrypt, PP, keygen(MSK, ["a"]), ct)

    def test_serialization_round_trips(self) -> None:
        m = _random_gt()
        ct = encrypt(PP, m, "region=eu-west and (hv=kvm-9.2 or tpm)")
        sk = keygen(MSK, ["region=eu-west", "hv=kvm-9.2"])
        pp2 = PublicParams.from_bytes(PP.to_bytes())
        msk2 = MasterKey.from_bytes(MSK.to_bytes())
        sk2 = SecretKey.from_bytes(sk.to_bytes())
        ct2 = Ciphertext.from_bytes(ct.to_bytes())
        self.assertEqual(PP.id, pp2.id)
        self.assertEqual(sk.to_bytes(), sk2.to_bytes())
        self.assertEqual(ct.to_bytes(), ct2.to_bytes())
        self.assertEqual(MSK.to_bytes(), msk2.to_bytes())
        self.assertEqual(m, decrypt(pp2, sk2, ct2))
        self.assertEqual(m, decrypt(PP, keygen(msk2, ["tpm", "region=eu-west"]), ct))
        self.assertEqual(sk.attributes, sk2.attributes)

    def test_every_truncation_is_malformed(self) -> None:
        ct = encrypt(PP, _random_gt(), "a or b").to_bytes()
        sk = keygen(MSK, ["a"]).to_bytes()
        cases = [
            (ct, Ciphertext.from_bytes, "ABE ciphertext"),
            (sk, SecretKey.from_bytes, "ABE secret key"),
            (PP.to_bytes(), PublicParams.from_bytes, "ABE public parameters"),
            (MSK.to_bytes(), MasterKey.from_bytes, "ABE master key"),
        ]
        for data, decode, name in cases:
            for n in range(0, len(data), 7):
                exc = self.assertRaises(MalformedError, decode, data[:n])
                self.assertEqual(name, exc.structure)
            self.assertRaises(MalformedError, decode, data + b"\x00")

    def test_garbage_and_wrong_kinds(self) -> None:
        self.assertRaises(MalformedError, Ciphertext.from_bytes, PP.to_bytes())
        self.assertRaises(MalformedError, SecretKey.from_bytes, os.urandom(500))
        self.assertRaises(MalformedError, PublicParams.from_bytes, "text")
        bad = bytearray(PP.to_bytes())
        bad[5] = 9  # version
        exc = self.assertRaises(MalformedError, PublicParams.from_bytes, bytes(bad))
        self.assertIn("version", str(exc))

    def test_invalid_point_is_malformed(self) -> None:
        data = bytearray(keygen(MSK, ["a"]).to_bytes())
        data[7 + 4 + 32 + 5] ^= 0x40  # inside D (G2)
        self.assertRaises(MalformedError, SecretKey.from_bytes, bytes(data))

    def test_ciphertext_policy_mismatch_is_malformed(self) -> None:
        ct = encrypt(PP, _random_gt(), "a or b")
        forged = dataclasses.replace(ct, policy="a or b or c")
        exc = self.assertRaises(
            MalformedError, Ciphertext.from_bytes, forged.to_bytes()
        )
        self.assertIn("leaf count", str(exc))
