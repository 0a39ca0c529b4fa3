"""Credential protection: MakeCredential against SoftTpm's ActivateCredential,
KDFa/KDFe against independent implementations, and tpm2_pytss interop."""

import functools
import hashlib
import hmac
import os
import struct

import testtools
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.concatkdf import ConcatKDFHash
from cryptography.hazmat.primitives.kdf.kbkdf import (
    KBKDFHMAC,
    CounterLocation,
    Mode,
)

from trusted_testing.softtpm import SoftTpm
from verifier.protocol import (
    CredentialChallenge,
    EvidenceError,
    MalformedError,
    make_credential,
)
from verifier.protocol import _marshal as m
from verifier.protocol import tpm as t
from verifier.protocol.credential import check_ek_template, kdfa, kdfe

try:
    import tpm2_pytss
    from tpm2_pytss import utils as pytss_utils
except ImportError:  # pragma: no cover - optional cross-check
    tpm2_pytss = None


@functools.cache
def _tpm(ek_alg: str) -> SoftTpm:
    return SoftTpm(ak_alg="ecc", ek_alg=ek_alg)


def _spec_kdfa(
    hash_name: str, key: bytes, label: bytes, u: bytes, v: bytes, bits: int
) -> bytes:
    """KDFa written from TPM 2.0 Part 1, 11.4.10.2 / SP 800-108 (counter
    mode, HMAC): K(i) = HMAC(key, [i]32 || label || 0x00 || U || V || [bits]32).
    """
    out = bytearray()
    i = 0
    while len(out) < (bits + 7) // 8:
        i += 1
        msg = struct.pack(">I", i) + label + b"\x00" + u + v + struct.pack(">I", bits)
        out += hmac.new(key, msg, hash_name).digest()
    return bytes(out[: (bits + 7) // 8])


def _spec_kdfe(
    hash_name: str, z: bytes, use: bytes, u: bytes, v: bytes, bits: int
) -> bytes:
    """KDFe (Part 1, 11.4.10.3): H([i]32 || Z || use || 0x00 || U || V)."""
    out = bytearray()
    i = 0
    while len(out) < bits // 8:
        i += 1
        msg = struct.pack(">I", i) + z + use + b"\x00" + u + v
        out += hashlib.new(hash_name, msg).digest()
    return bytes(out[: bits // 8])


_HASH_CLASSES = {"sha1": hashes.SHA1, "sha256": hashes.SHA256, "sha384": hashes.SHA384}


class KdfTest(testtools.TestCase):
    CASES = [
        ("sha256", b"STORAGE", b"\x00\x0b" + bytes(range(32)), b"", 128),
        ("sha256", b"INTEGRITY", b"", b"", 256),
        ("sha256", b"ATH", b"u" * 20, b"v" * 20, 512),  # two blocks
        ("sha256", b"X", b"", b"", 520),  # partial third block
        ("sha384", b"STORAGE", b"name", b"", 256),
        ("sha1", b"STORAGE", b"name", b"", 128),
    ]

    def test_kdfa_matches_spec_implementation(self) -> None:
        key = bytes(range(32))
        for hash_name, label, u, v, bits in self.CASES:
            ours = kdfa(hash_name, key, label, u, v, bits)
            self.assertEqual(bits // 8, len(ours))
            self.assertEqual(_spec_kdfa(hash_name, key, label, u, v, bits), ours)

    def test_kdfa_matches_cryptography_kbkdf(self) -> None:
        key = os.urandom(32)
        for hash_name, label, u, v, bits in self.CASES:
            ref = KBKDFHMAC(
                algorithm=_HASH_CLASSES[hash_name](),
                mode=Mode.CounterMode,
                length=bits // 8,
                rlen=4,
                llen=4,
                location=CounterLocation.BeforeFixed,
                label=label,
                context=u + v,
                fixed=None,
            ).derive(key)
            self.assertEqual(ref, kdfa(hash_name, key, label, u, v, bits))

    def test_kdfa_known_answer(self) -> None:
        # One block, spelled out byte by byte: pins the exact encoding.
        key = bytes(32)
        expected = hmac.new(
            key,
            bytes.fromhex("00000001")
            + b"STORAGE\x00"
            + b"ctx"
            + bytes.fromhex("00000080"),
            "sha256",
        ).digest()[:16]
        self.assertEqual(expected, kdfa("sha256", key, b"STORAGE", b"ctx", b"", 128))

    def test_kdfa_inputs_all_matter(self) -> None:
        key = os.urandom(32)
        base = kdfa("sha256", key, b"L", b"U", b"V", 256)
        self.assertNotEqual(base, kdfa("sha256", key, b"M", b"U", b"V", 256))
        self.assertNotEqual(base, kdfa("sha256", key, b"L", b"X", b"V", 256))
        self.assertNotEqual(base, kdfa("sha256", key, b"L", b"U", b"X", 256))
        self.assertNotEqual(base[:16], kdfa("sha256", key, b"L", b"U", b"V", 128))
        self.assertNotEqual(base, kdfa("sha256", os.urandom(32), b"L", b"U", b"V", 256))

    def test_kdfe_matches_spec_and_concat_kdf(self) -> None:
        z = os.urandom(32)
        for bits in (128, 256, 512):
            ours = kdfe("sha256", z, b"IDENTITY", b"x" * 32, b"y" * 32, bits)
            self.assertEqual(
                _spec_kdfe("sha256", z, b"IDENTITY", b"x" * 32, b"y" * 32, bits), ours
            )
            ref = ConcatKDFHash(
                hashes.SHA256(), bits // 8, b"IDENTITY\x00" + b"x" * 32 + b"y" * 32
            ).derive(z)
            self.assertEqual(ref, ours)

    def test_kdfa_matches_tpm2_pytss(self) -> None:
        if tpm2_pytss is None:
            self.skipTest("tpm2_pytss not installed")
        from tpm2_pytss.internal.crypto import _kdfa

        key = os.urandom(32)
        for _, label, u, v, bits in self.CASES:
            self.assertEqual(
                _kdfa(tpm2_pytss.TPM2_ALG.SHA256, key, label, u, v, bits),
                kdfa("sha256", key, label, u, v, bits),
            )


class MakeCredentialTest(testtools.TestCase):
    def _round_trip(self, ek_alg: str) -> None:
        tpm = _tpm(ek_alg)
        secret = os.urandom(32)
        challenge = make_credential(tpm.ek, tpm.ak.name, secret)
        self.assertIsInstance(challenge, CredentialChallenge)
        self.assertEqual(
            secret,
            tpm.activate_credential(
                challenge.credential_blob, challenge.encrypted_secret
            ),
        )

    def test_rsa_ek_activates(self) -> None:
        self._round_trip("rsa")

    def test_ecc_ek_activates(self) -> None:
        self._round_trip("ecc")

    def test_short_credential_activates(self) -> None:
        tpm = _tpm("ecc")
        challenge = make_credential(tpm.ek, tpm.ak.name, b"\x01")
        self.assertEqual(
            b"\x01",
            tpm.activate_credential(
                challenge.credential_blob, challenge.encrypted_secret
            ),
        )

    def test_structure_sizes(self) -> None:
        for ek_alg, secret_len in (("rsa", 2 + 256), ("ecc", 2 + 2 + 32 + 2 + 32)):
            tpm = _tpm(ek_alg)
            challenge = make_credential(tpm.ek, tpm.ak.name, bytes(32))
            # TPM2B(TPM2B(hmac 32) || CFB(TPM2B(credential 32)))
            self.assertEqual(2 + 2 + 32 + 2 + 32, len(challenge.credential_blob))
            self.assertEqual(secret_len, len(challenge.encrypted_secret))
            outer = m.Reader(challenge.credential_blob, "blob")
            outer.tpm2b()
            outer.end()

    def test_challenges_are_randomised(self) -> None:
        tpm = _tpm("rsa")
        a = make_credential(tpm.ek, tpm.ak.name, bytes(32))
        b = make_credential(tpm.ek, tpm.ak.name, bytes(32))
        self.assertNotEqual(a.encrypted_secret, b.encrypted_secret)
        self.assertNotEqual(a.credential_blob, b.credential_blob)

    def test_challenge_for_another_ak_name_fails(self) -> None:
        for ek_alg in ("rsa", "ecc"):
            tpm = _tpm(ek_alg)
            other_name = SoftTpm(ak_alg="ecc", ek_key=tpm.ek_key).ak.name
            self.assertNotEqual(tpm.ak.name, other_name)
            challenge = make_credential(tpm.ek, other_name, os.urandom(32))
            exc = self.assertRaises(
                EvidenceError,
                tpm.activate_credential,
                challenge.credential_blob,
                challenge.encrypted_secret,
            )
            self.assertEqual("credential", exc.reason)

    def test_tampered_blob_fails(self) -> None:
        tpm = _tpm("rsa")
        challenge = make_credential(tpm.ek, tpm.ak.name, os.urandom(32))
        blob = challenge.credential_blob
        # integrity HMAC, first and last byte of encIdentity
        for offset in (4, 4 + 31, 4 + 32 + 2, len(blob) - 1):
            raw = bytearray(blob)
            raw[offset] ^= 0x80
            exc = self.assertRaises(
                EvidenceError,
                tpm.activate_credential,
                bytes(raw),
                challenge.encrypted_secret,
            )
            self.assertEqual("credential", exc.reason, offset)

    def test_ek_not_restricted_decrypt_is_refused(self) -> None:
        tpm = _tpm("rsa")
        ek = tpm.ek
        key = tpm.ek_key.public_key()
        bad = {
            "not restricted": ek.attributes & ~t.ATTR_RESTRICTED,
            "not decrypt": ek.attributes & ~t.ATTR_DECRYPT,
            "sign instead of decrypt": (ek.attributes & ~t.ATTR_DECRYPT) | t.ATTR_SIGN,
            "not fixedTPM": ek.attributes & ~t.ATTR_FIXED_TPM,
        }
        for label, attrs in bad.items():
            public = t.make_public(
                key, attrs, ek.scheme, symmetric=ek.symmetric, auth_policy=bytes(32)
            )
            exc = self.assertRaises(EvidenceError, check_ek_template, public)
            self.assertEqual("ek_template", exc.reason, label)
            exc = self.assertRaises(
                EvidenceError, make_credential, public, tpm.ak.name, bytes(32)
            )
            self.assertEqual("ek_template", exc.reason, label)
        # An AK (restricted signing key) is not an EK either.
        exc = self.assertRaises(EvidenceError, check_ek_template, tpm.ak)
        self.assertEqual("ek_template", exc.reason)
        check_ek_template(ek)

    def test_ek_without_aes_cfb_is_refused(self) -> None:
        tpm = _tpm("rsa")
        ek = tpm.ek
        key = tpm.ek_key.public_key()
        for sym in ((t.ALG_NULL, 0, t.ALG_NULL), (t.ALG_AES, 128, 0x0044)):
            public = t.make_public(key, ek.attributes, ek.scheme, symmetric=sym)
            exc = self.assertRaises(EvidenceError, check_ek_template, public)
            self.assertEqual("ek_template", exc.reason)

    def test_credential_size_limits(self) -> None:
        tpm = _tpm("rsa")
        for bad in (b"", bytes(33)):
            self.assertRaises(ValueError, make_credential, tpm.ek, tpm.ak.name, bad)

    def test_challenge_for_another_ek_does_not_activate(self) -> None:
        tpm = _tpm("ecc")
        other = SoftTpm(ak_alg="ecc", ek_alg="ecc", ak_key=tpm.ak_key)
        self.assertEqual(tpm.ak.name, other.ak.name)
        challenge = make_credential(other.ek, tpm.ak.name, os.urandom(32))
        # Different seed -> integrity failure in this TPM.
        exc = self.assertRaises(
            EvidenceError,
            tpm.activate_credential,
            challenge.credential_blob,
            challenge.encrypted_secret,
        )
        self.assertEqual("credential", exc.reason)


class Tpm2PytssInteropTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        if tpm2_pytss is None:
            self.skipTest("tpm2_pytss not installed")

    def _their_challenge(self, tpm: SoftTpm, secret: bytes) -> tuple[bytes, bytes]:
        ek_pub = tpm2_pytss.TPM2B_PUBLIC.unmarshal(tpm.ek.to_bytes())[0]
        blob, enc = pytss_utils.make_credential(
            ek_pub, secret, tpm2_pytss.TPM2B_NAME(tpm.ak.name)
        )
        return blob.marshal(), enc.marshal()

    def test_tpm2_pytss_make_credential_activates_in_softtpm(self) -> None:
        for ek_alg in ("rsa", "ecc"):
            tpm = _tpm(ek_alg)
            secret = os.urandom(32)
            blob, enc = self._their_challenge(tpm, secret)
            self.assertEqual(secret, tpm.activate_credential(blob, enc), ek_alg)

    def test_structure_sizes_match_tpm2_pytss(self) -> None:
        for ek_alg in ("rsa", "ecc"):
            tpm = _tpm(ek_alg)
            secret = os.urandom(32)
            blob, enc = self._their_challenge(tpm, secret)
            ours = make_credential(tpm.ek, tpm.ak.name, secret)
            self.assertEqual(len(blob), len(ours.credential_blob), ek_alg)
            self.assertEqual(len(enc), len(ours.encrypted_secret), ek_alg)
            # Our output parses as their types, consuming every byte.
            idobj, used = tpm2_pytss.TPM2B_ID_OBJECT.unmarshal(ours.credential_blob)
            self.assertEqual(len(ours.credential_blob), used)
            sec, used = tpm2_pytss.TPM2B_ENCRYPTED_SECRET.unmarshal(
                ours.encrypted_secret
            )
            self.assertEqual(len(ours.encrypted_secret), used)

    def test_ecc_secret_is_a_point_on_the_ek_curve(self) -> None:
        tpm = _tpm("ecc")
        ours = make_credential(tpm.ek, tpm.ak.name, bytes(32))
        r = m.Reader(m.Reader(ours.encrypted_secret, "s").tpm2b(), "TPMS_ECC_POINT")
        x, y = r.tpm2b(), r.tpm2b()
        r.end()
        from cryptography.hazmat.primitives.asymmetric import ec

        # Raises ValueError if not on P-256.
        ec.EllipticCurvePublicNumbers(
            int.from_bytes(x, "big"), int.from_bytes(y, "big"), ec.SECP256R1()
        ).public_key()

    def test_name_of_softtpm_ak_matches_tpm2_pytss(self) -> None:
        tpm = _tpm("rsa")
        theirs = tpm2_pytss.TPM2B_PUBLIC.unmarshal(tpm.ak.to_bytes())[0]
        self.assertEqual(tpm.ak.name, bytes(theirs.get_name()))


class MalformedChallengeTest(testtools.TestCase):
    def test_truncated_blob_is_malformed(self) -> None:
        tpm = _tpm("rsa")
        challenge = make_credential(tpm.ek, tpm.ak.name, bytes(32))
        self.assertRaises(
            MalformedError,
            tpm.activate_credential,
            challenge.credential_blob[:10],
            challenge.encrypted_secret,
        )
