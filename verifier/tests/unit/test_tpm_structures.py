"""TPM 2.0 wire structures: round trips, strict parsing, fuzzing."""

import functools
import hashlib

import hypothesis
import testtools
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from hypothesis import strategies as st

from trusted_testing.softtpm import SoftTpm
from verifier.protocol import MalformedError, TpmAttest, TpmPublic, TpmSignature
from verifier.protocol import _marshal as m
from verifier.protocol import tpm as t

try:
    import tpm2_pytss
except ImportError:  # pragma: no cover - optional cross-check
    tpm2_pytss = None

FUZZ = hypothesis.settings(max_examples=300, deadline=None)


@functools.cache
def _tpm(ak_alg: str, ek_alg: str) -> SoftTpm:
    tpm = SoftTpm(ak_alg=ak_alg, ek_alg=ek_alg)
    tpm.extend(16, b"boot")
    return tpm


@functools.cache
def _samples() -> dict[str, list[bytes]]:
    """Valid encodings to round-trip and to mutate."""
    ecc, rsa_ = _tpm("ecc", "rsa"), _tpm("rsa", "ecc")
    quotes = [ecc.quote(b"n" * 32, (16,)), rsa_.quote(b"", (0, 7, 16, 23))]
    return {
        "attest": [q.attest for q in quotes],
        "signature": [q.signature for q in quotes],
        "public": [ecc.ak.to_bytes(), ecc.ek.to_bytes(), rsa_.ak.to_bytes()]
        + [rsa_.ek.to_bytes()],
    }


_PARSERS = {
    "attest": (TpmAttest.from_bytes, "TPMS_ATTEST"),
    "signature": (TpmSignature.from_bytes, "TPMT_SIGNATURE"),
    "public": (TpmPublic.from_bytes, "TPM2B_PUBLIC"),
}


class RoundTripTest(testtools.TestCase):
    def test_round_trips(self) -> None:
        for kind, blobs in _samples().items():
            parse = _PARSERS[kind][0]
            for blob in blobs:
                parsed = parse(blob)
                self.assertEqual(blob, parsed.to_bytes(), kind)
                self.assertEqual(parsed, parse(parsed.to_bytes()), kind)

    def test_attest_fields(self) -> None:
        tpm = SoftTpm()
        tpm.reset_count, tpm.restart_count = 2, 9
        quote = tpm.quote(b"q" * 32, (1, 16))
        attest = TpmAttest.from_bytes(quote.attest)
        self.assertEqual(t.TPM_GENERATED_VALUE, attest.magic)
        self.assertEqual(t.ST_ATTEST_QUOTE, attest.type)
        self.assertEqual(tpm.ak.name, attest.qualified_signer)
        self.assertEqual(b"q" * 32, attest.extra_data)
        self.assertEqual(t.ClockInfo(tpm.clock, 2, 9, True), attest.clock_info)
        self.assertEqual((t.PcrSelection(t.ALG_SHA256, (1, 16)),), attest.pcr_select)
        expected = hashlib.sha256(tpm.pcrs[1] + tpm.pcrs[16]).digest()
        self.assertEqual(expected, attest.pcr_digest)

    def test_signature_fields(self) -> None:
        ecdsa = TpmSignature.from_bytes(_samples()["signature"][0])
        self.assertEqual((t.ALG_ECDSA, t.ALG_SHA256), (ecdsa.sig_alg, ecdsa.hash_alg))
        self.assertEqual((32, 32, b""), (len(ecdsa.r), len(ecdsa.s), ecdsa.sig))
        rsassa = TpmSignature.from_bytes(_samples()["signature"][1])
        self.assertEqual(t.ALG_RSASSA, rsassa.sig_alg)
        self.assertEqual(256, len(rsassa.sig))

    def test_unsupported_signature_scheme_is_malformed(self) -> None:
        for alg in (t.ALG_ECDAA, t.ALG_ECSCHNORR, t.ALG_NULL, 0xFFFF):
            data = m.u16(alg) + m.u16(t.ALG_SHA256) + m.tpm2b(b"x")
            exc = self.assertRaises(MalformedError, TpmSignature.from_bytes, data)
            self.assertEqual("TPMT_SIGNATURE", exc.structure)

    def test_unsupported_signature_hash_is_malformed(self) -> None:
        data = m.u16(t.ALG_RSASSA) + m.u16(0x0012) + m.tpm2b(b"x")  # SM3
        self.assertRaises(MalformedError, TpmSignature.from_bytes, data)

    def test_non_bytes_is_malformed(self) -> None:
        for parse, structure in _PARSERS.values():
            exc = self.assertRaises(MalformedError, parse, "not bytes")
            self.assertEqual(structure, exc.structure)


class StrictParsingTest(testtools.TestCase):
    def test_truncated_input_names_the_structure(self) -> None:
        for kind, blobs in _samples().items():
            parse, structure = _PARSERS[kind]
            for blob in blobs:
                for n in range(len(blob)):
                    exc = self.assertRaises(MalformedError, parse, blob[:n])
                    self.assertEqual(structure, exc.structure, f"{kind}[:{n}]")
                    self.assertIn("truncated", exc.detail)

    def test_trailing_bytes_are_rejected(self) -> None:
        for kind, blobs in _samples().items():
            parse, structure = _PARSERS[kind]
            for blob in blobs:
                for tail in (b"\x00", b"\xff" * 7):
                    exc = self.assertRaises(MalformedError, parse, blob + tail)
                    self.assertEqual(structure, exc.structure, kind)
                    self.assertIn(f"{len(tail)} trailing bytes", exc.detail)

    def test_trailing_bytes_inside_tpm2b_public_are_rejected(self) -> None:
        raw = _tpm("ecc", "rsa").ak.raw + b"\x00"
        exc = self.assertRaises(MalformedError, TpmPublic.from_bytes, m.tpm2b(raw))
        self.assertEqual("TPMT_PUBLIC", exc.structure)
        self.assertIn("trailing", exc.detail)

    def test_rsa_modulus_size_must_match_key_bits(self) -> None:
        pub = _tpm("rsa", "ecc").ak
        raw = bytearray(pub.raw)
        # keyBits sits right before the exponent and the TPM2B modulus.
        at = len(raw) - 2 - 256 - 4 - 2
        self.assertEqual(2048, int.from_bytes(raw[at : at + 2], "big"))
        raw[at : at + 2] = m.u16(1024)
        exc = self.assertRaises(MalformedError, TpmPublic.from_tpmt, bytes(raw))
        self.assertIn("keyBits", exc.detail)

    def test_unsupported_key_type_and_curve_are_malformed(self) -> None:
        raw = _tpm("ecc", "rsa").ak.raw
        kh = m.u16(0x0008) + raw[2:]  # TPM_ALG_KEYEDHASH
        exc = self.assertRaises(MalformedError, TpmPublic.from_tpmt, kh)
        self.assertIn("key type", exc.detail)
        # ECC: the curve follows symmetric (NULL) and scheme (ECDSA, SHA256).
        pub = TpmPublic.from_tpmt(raw)
        head = 2 + 2 + 4 + 2 + len(pub.auth_policy) + 2 + 4
        self.assertEqual(t.ECC_NIST_P256, int.from_bytes(raw[head : head + 2], "big"))
        bn = raw[:head] + m.u16(0x0010) + raw[head + 2 :]  # BN P-256
        exc = self.assertRaises(MalformedError, TpmPublic.from_tpmt, bn)
        self.assertIn("curve", exc.detail)

    def test_rsa_key_with_rsaes_scheme_parses(self) -> None:
        # TPMU_ASYM_SCHEME for TPM_ALG_RSAES is TPMS_EMPTY (Part 2, 11.2.3.5):
        # no hashAlg follows the scheme selector. _read_scheme reads one
        # anyway, so a valid RSAES key misparses.
        key = rsa.generate_private_key(65537, 2048).public_key()
        attrs = t.ATTR_FIXED_TPM | t.ATTR_FIXED_PARENT | t.ATTR_DECRYPT
        n = key.public_numbers().n.to_bytes(256, "big")
        raw = (
            m.u16(t.ALG_RSA)
            + m.u16(t.ALG_SHA256)
            + m.u32(attrs)
            + m.tpm2b(b"")
            + m.u16(t.ALG_NULL)  # symmetric
            + m.u16(t.ALG_RSAES)  # scheme, no details
            + m.u16(2048)
            + m.u32(0)
            + m.tpm2b(n)
        )
        pub = TpmPublic.from_tpmt(raw)
        self.assertEqual(t.ALG_RSAES, pub.scheme[0])
        self.assertTrue(pub.same_key(key))


class NameAndKeyTest(testtools.TestCase):
    def test_name_is_namealg_and_sha256_of_tpmt_public(self) -> None:
        for pub in (
            _tpm("ecc", "rsa").ak,
            _tpm("ecc", "rsa").ek,
            _tpm("rsa", "ecc").ak,
        ):
            self.assertEqual(34, len(pub.name))
            self.assertEqual(b"\x00\x0b" + hashlib.sha256(pub.raw).digest(), pub.name)
            self.assertEqual(pub.raw, pub.to_bytes()[2:])

    def test_name_changes_with_attributes(self) -> None:
        tpm = _tpm("ecc", "rsa")
        other = t.make_public(
            tpm.ak_key.public_key(), tpm.ak.attributes | t.ATTR_DECRYPT, tpm.ak.scheme
        )
        self.assertNotEqual(tpm.ak.name, other.name)
        self.assertNotEqual(tpm.ak, other)

    def test_public_key_matches_softtpm_key(self) -> None:
        ecc, rsa_ = _tpm("ecc", "rsa"), _tpm("rsa", "ecc")
        pairs = [
            (ecc.ak, ecc.ak_key),
            (ecc.ek, ecc.ek_key),
            (rsa_.ak, rsa_.ak_key),
            (rsa_.ek, rsa_.ek_key),
        ]
        for pub, priv in pairs:
            key = pub.public_key()
            self.assertEqual(priv.public_key().public_numbers(), key.public_numbers())
            self.assertTrue(pub.same_key(priv.public_key()))
        self.assertIsInstance(ecc.ak.public_key(), ec.EllipticCurvePublicKey)
        self.assertIsInstance(rsa_.ak.public_key(), rsa.RSAPublicKey)
        self.assertFalse(ecc.ak.same_key(rsa_.ak_key.public_key()))
        self.assertFalse(ecc.ak.same_key(ecc.ek_key.public_key()))
        self.assertFalse(rsa_.ak.same_key(rsa_.ek_key.public_key()))
        self.assertFalse(rsa_.ak.same_key(object()))

    def test_point_not_on_curve_is_malformed(self) -> None:
        pub = _tpm("ecc", "rsa").ak
        x, y = pub.unique
        bad_y = (int.from_bytes(y, "big") ^ 1).to_bytes(32, "big")
        raw = pub.raw[: -len(y)] + bad_y
        parsed = TpmPublic.from_tpmt(raw)  # structurally fine
        exc = self.assertRaises(MalformedError, parsed.public_key)
        self.assertEqual("TPMT_PUBLIC", exc.structure)

    def test_cross_check_with_tpm2_pytss(self) -> None:
        if tpm2_pytss is None:
            self.skipTest("tpm2_pytss not installed")
        for tpm in (_tpm("ecc", "rsa"), _tpm("rsa", "ecc")):
            for pub in (tpm.ak, tpm.ek):
                theirs, used = tpm2_pytss.TPM2B_PUBLIC.unmarshal(pub.to_bytes())
                self.assertEqual(len(pub.to_bytes()), used)
                self.assertEqual(pub.name, bytes(theirs.get_name()))
                self.assertEqual(pub.to_bytes(), theirs.marshal())
            quote = tpm.quote(b"x" * 32, (0, 16))
            attest, used = tpm2_pytss.TPMS_ATTEST.unmarshal(quote.attest)
            self.assertEqual(len(quote.attest), used)
            self.assertEqual(b"x" * 32, bytes(attest.extraData))
            self.assertEqual(tpm.clock, attest.clockInfo.clock)
            sig, used = tpm2_pytss.TPMT_SIGNATURE.unmarshal(quote.signature)
            self.assertEqual(len(quote.signature), used)
            self.assertEqual(quote.signature, sig.marshal())


class FuzzTest(testtools.TestCase):
    def _only_malformed(self, parse, data: bytes) -> None:
        try:
            parse(data)
        except MalformedError:
            pass

    @FUZZ
    @hypothesis.given(st.binary(max_size=600))
    def test_random_bytes_attest(self, data: bytes) -> None:
        self._only_malformed(TpmAttest.from_bytes, data)

    @FUZZ
    @hypothesis.given(st.binary(max_size=600))
    def test_random_bytes_signature(self, data: bytes) -> None:
        self._only_malformed(TpmSignature.from_bytes, data)

    @FUZZ
    @hypothesis.given(st.binary(max_size=600))
    def test_random_bytes_public(self, data: bytes) -> None:
        self._only_malformed(TpmPublic.from_bytes, data)

    @FUZZ
    @hypothesis.given(
        st.sampled_from(sorted(_PARSERS)),
        st.integers(0, 3),
        st.integers(0, 10**6),
        st.binary(min_size=1, max_size=8),
        st.sampled_from(["xor", "insert", "delete", "replace"]),
    )
    def test_mutated_valid_structures(
        self, kind: str, which: int, pos: int, chunk: bytes, op: str
    ) -> None:
        blobs = _samples()[kind]
        blob = bytearray(blobs[which % len(blobs)])
        i = pos % len(blob)
        if op == "xor":
            blob[i] ^= chunk[0] or 1
        elif op == "insert":
            blob[i:i] = chunk
        elif op == "delete":
            del blob[i : i + len(chunk)]
        else:
            blob[i : i + len(chunk)] = chunk
        parse = _PARSERS[kind][0]
        try:
            parsed = parse(bytes(blob))
        except MalformedError:
            return
        if kind == "public":
            try:
                parsed.public_key()
                _ = parsed.name
            except MalformedError:
                pass


_pcr_sets = st.sets(st.integers(0, 23)).map(lambda s: tuple(sorted(s)))


class PcrSelectionTest(testtools.TestCase):
    @FUZZ
    @hypothesis.given(
        st.lists(st.tuples(st.sampled_from(sorted(t._HASHES)), _pcr_sets), max_size=4)
    )
    def test_bitmap_round_trip(self, banks: list[tuple[int, tuple[int, ...]]]) -> None:
        selections = tuple(t.PcrSelection(alg, pcrs) for alg, pcrs in banks)
        data = t.PcrSelection.list_to_bytes(selections)
        self.assertEqual(4 + 6 * len(selections), len(data))
        reader = m.Reader(data, "TPML_PCR_SELECTION")
        self.assertEqual(selections, t.PcrSelection.read_list(reader))
        reader.end()

    def test_bitmap_known_answer(self) -> None:
        sel = t.PcrSelection(t.ALG_SHA256, (0, 7, 8, 16, 23))
        self.assertEqual(
            bytes.fromhex("00000001000b03810181"),
            t.PcrSelection.list_to_bytes([sel]),
        )

    def test_four_byte_bitmap_is_read(self) -> None:
        data = m.u32(1) + m.u16(t.ALG_SHA256) + bytes([4]) + bytes([1, 0, 1, 0])
        sel = t.PcrSelection.read_list(m.Reader(data, "x"))
        self.assertEqual((t.PcrSelection(t.ALG_SHA256, (0, 16)),), sel)

    def test_pcr_beyond_23_is_malformed(self) -> None:
        data = m.u32(1) + m.u16(t.ALG_SHA256) + bytes([4]) + bytes([0, 0, 0, 1])
        self.assertRaises(MalformedError, t.PcrSelection.read_list, m.Reader(data, "x"))

    def test_bad_select_size_or_count_is_malformed(self) -> None:
        for size in (0, 2, 5):
            data = m.u32(1) + m.u16(t.ALG_SHA256) + bytes([size]) + bytes(size)
            exc = self.assertRaises(
                MalformedError, t.PcrSelection.read_list, m.Reader(data, "TPML")
            )
            self.assertEqual("TPML", exc.structure)
        exc = self.assertRaises(
            MalformedError, t.PcrSelection.read_list, m.Reader(m.u32(17), "TPML")
        )
        self.assertIn("17 PCR banks", exc.detail)

    def test_invalid_selection_is_malformed(self) -> None:
        for pcrs in ((16, 15), (1, 1), (24,), (-1,)):
            self.assertRaises(MalformedError, t.PcrSelection, t.ALG_SHA256, pcrs)
        self.assertRaises(MalformedError, t.PcrSelection, 0x0012, (1,))
