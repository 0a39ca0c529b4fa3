"""Attacks on quote verification, one test per attack.

Honest evidence comes from :class:`SoftTpm`; each test then tampers with it
the way an attacker would and asserts the exact failure reason.
"""

import base64
import dataclasses
import functools
import json
import os

import testtools
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

from trusted_testing.softtpm import SoftTpm
from verifier.protocol import (
    AttestationKey,
    ClockState,
    EvidenceError,
    MalformedError,
    PcrPolicy,
    Quote,
    QuoteVerdict,
    TpmAttest,
    TpmSignature,
    bind_nonce,
    check_ak_template,
    verify_quote,
)
from verifier.protocol import tpm as t

NK = b"node share-transport key"


@functools.cache
def _ek_key() -> rsa.RSAPrivateKey:
    # One RSA EK for the whole module: quotes never touch the EK.
    return rsa.generate_private_key(65537, 2048)


def _tpm(ak_alg: str = "ecc") -> SoftTpm:
    return SoftTpm(ak_alg=ak_alg, ek_key=_ek_key())


def _resign(tpm: SoftTpm, quote: Quote, **changes: object) -> Quote:
    """Re-encode the quote's attest with ``changes`` and sign it with the AK
    (what a compromised node could do with a TPM-resident key only for data
    that passes the TPM's own checks -- here it models a forged TPM)."""
    attest = dataclasses.replace(TpmAttest.from_bytes(quote.attest), **changes)
    raw = attest.to_bytes()
    return Quote(raw, tpm.sign(raw).to_bytes(), dict(quote.pcr_values))


class QuoteAttackTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.tpm = _tpm()
        self.tpm.extend(16, b"measured boot of the node image")
        self.good16 = self.tpm.pcrs[16]
        self.policy = PcrPolicy({16: frozenset({self.good16})})
        self.ak = AttestationKey(self.tpm.ak, activated=True)
        self.nonce = os.urandom(32)
        self.qd = bind_nonce(self.nonce, NK)

    def _verify(self, quote: Quote, **kw: object) -> QuoteVerdict:
        args: dict[str, object] = {
            "ak": self.ak,
            "qualifying_data": self.qd,
            "policy": self.policy,
        }
        args.update(kw)
        return verify_quote(quote, **args)  # type: ignore[arg-type]

    def _assert_evidence(self, reason: str, quote: Quote, **kw: object) -> None:
        exc = self.assertRaises(EvidenceError, self._verify, quote, **kw)
        self.assertEqual(reason, exc.reason, str(exc))

    # -- sanity: the honest quote passes, so every failure below is caused
    #    by the tampering and nothing else.

    def test_honest_quote_verifies(self) -> None:
        verdict = self._verify(self.tpm.quote(self.qd, (16,)))
        self.assertTrue(verdict)
        self.assertEqual({16: self.good16}, dict(verdict.pcr_values))

    # -- nonce / freshness

    def test_quote_with_wrong_nonce_is_rejected(self) -> None:
        quote = self.tpm.quote(bind_nonce(os.urandom(32), NK), (16,))
        self._assert_evidence("nonce_mismatch", quote)

    def test_quote_binding_other_data_is_rejected(self) -> None:
        # Right nonce, but the node committed to a different transport key.
        quote = self.tpm.quote(bind_nonce(self.nonce, b"attacker key"), (16,))
        self._assert_evidence("nonce_mismatch", quote)

    def test_raw_nonce_instead_of_bound_nonce_is_rejected(self) -> None:
        quote = self.tpm.quote(self.nonce, (16,))
        self._assert_evidence("nonce_mismatch", quote)

    def test_replayed_quote_with_old_nonce_is_rejected(self) -> None:
        n1 = os.urandom(32)
        old = self.tpm.quote(bind_nonce(n1, NK), (16,))
        # It was valid for the round that asked for n1 ...
        self.assertTrue(self._verify(old, qualifying_data=bind_nonce(n1, NK)))
        # ... and is replayed for a fresh round asking for n2.
        n2 = os.urandom(32)
        self._assert_evidence("nonce_mismatch", old, qualifying_data=bind_nonce(n2, NK))

    # -- signature

    def test_tampered_attest_is_rejected(self) -> None:
        quote = self.tpm.quote(self.qd, (16,))
        attest = TpmAttest.from_bytes(quote.attest)
        # Offset of the clock: magic, type, TPM2B signer, TPM2B extraData.
        clock_at = 4 + 2 + 2 + len(attest.qualified_signer) + 2 + len(self.qd)
        self.assertEqual(
            attest.clock_info.clock,
            int.from_bytes(quote.attest[clock_at : clock_at + 8], "big"),
        )
        for offset in (clock_at + 7, len(quote.attest) - 1, 0):
            raw = bytearray(quote.attest)
            raw[offset] ^= 0x01
            tampered = dataclasses.replace(quote, attest=bytes(raw))
            self._assert_evidence("signature_invalid", tampered)

    def test_tampered_signature_is_rejected(self) -> None:
        quote = self.tpm.quote(self.qd, (16,))
        raw = bytearray(quote.signature)
        raw[-1] ^= 0x01
        self._assert_evidence(
            "signature_invalid", dataclasses.replace(quote, signature=bytes(raw))
        )

    def test_quote_signed_by_another_ak_is_rejected(self) -> None:
        other = _tpm()
        other.pcrs = dict(self.tpm.pcrs)
        quote = other.quote(self.qd, (16,))
        # It is a perfectly good quote for the other TPM's AK ...
        self.assertTrue(self._verify(quote, ak=AttestationKey(other.ak, True)))
        # ... but not for this node's.
        self._assert_evidence("signature_invalid", quote)

    def test_quote_signed_by_another_rsa_ak_is_rejected(self) -> None:
        tpm = _tpm("rsa")
        other = _tpm("rsa")
        quote = other.quote(self.qd, (16,))
        quote = dataclasses.replace(quote, pcr_values={16: bytes(32)})
        policy = PcrPolicy({16: frozenset({bytes(32)})})
        self._assert_evidence(
            "signature_invalid",
            quote,
            ak=AttestationKey(tpm.ak, True),
            policy=policy,
        )

    def test_signature_scheme_not_matching_ak_is_rejected(self) -> None:
        rsa_tpm = _tpm("rsa")
        quote = self.tpm.quote(self.qd, (16,))  # ECDSA signature
        self._assert_evidence(
            "signature_scheme", quote, ak=AttestationKey(rsa_tpm.ak, True)
        )

    def test_sha1_signature_hash_is_rejected(self) -> None:
        quote = self.tpm.quote(self.qd, (16,))
        der = self.tpm.ak_key.sign(quote.attest, ec.ECDSA(hashes.SHA1()))
        r, s = decode_dss_signature(der)
        sig = TpmSignature(
            t.ALG_ECDSA,
            t.ALG_SHA1,
            r=r.to_bytes(32, "big"),
            s=s.to_bytes(32, "big"),
        )
        self._assert_evidence(
            "signature_hash", dataclasses.replace(quote, signature=sig.to_bytes())
        )

    def test_unparseable_signature_is_malformed(self) -> None:
        quote = self.tpm.quote(self.qd, (16,))
        bad = dataclasses.replace(quote, signature=quote.signature[:-1])
        exc = self.assertRaises(MalformedError, self._verify, bad)
        self.assertEqual("TPMT_SIGNATURE", exc.structure)

    # -- attest structure

    def test_quote_of_wrong_type_is_rejected(self) -> None:
        quote = _resign(self.tpm, self.tpm.quote(self.qd, (16,)), type=0x8017)
        exc = self.assertRaises(MalformedError, self._verify, quote)
        self.assertEqual("TPMS_ATTEST", exc.structure)
        self.assertIn("0x8017", exc.detail)

    def test_bad_magic_is_rejected(self) -> None:
        quote = _resign(
            self.tpm, self.tpm.quote(self.qd, (16,)), magic=t.TPM_GENERATED_VALUE + 1
        )
        self._assert_evidence("magic", quote)

    # -- PCRs

    def test_pcr_mismatch_is_rejected(self) -> None:
        self.tpm.extend(16, b"something not in the policy")
        quote = self.tpm.quote(self.qd, (16,))
        self._assert_evidence("pcr_policy", quote)

    def test_reported_pcr_values_not_matching_signed_digest_are_rejected(
        self,
    ) -> None:
        self.tpm.extend(16, b"rootkit")
        quote = self.tpm.quote(self.qd, (16,))
        # The node lies and reports the good value the policy wants.
        lying = dataclasses.replace(quote, pcr_values={16: self.good16})
        self._assert_evidence("pcr_digest_mismatch", lying)

    def test_missing_pcr_value_is_rejected(self) -> None:
        quote = self.tpm.quote(self.qd, (15, 16))
        values = dict(quote.pcr_values)
        del values[15]
        self._assert_evidence(
            "pcr_values", dataclasses.replace(quote, pcr_values=values)
        )

    def test_short_pcr_value_is_rejected(self) -> None:
        quote = self.tpm.quote(self.qd, (16,))
        bad = dataclasses.replace(quote, pcr_values={16: self.good16[:31]})
        self._assert_evidence("pcr_values", bad)

    def test_policy_pcr_not_quoted_is_rejected(self) -> None:
        policy = PcrPolicy({15: frozenset({bytes(32)})})
        quote = self.tpm.quote(self.qd, (16,))
        self._assert_evidence("pcr_selection", quote, policy=policy)

    def test_quote_of_sha1_bank_without_its_values_is_rejected(self) -> None:
        # sha256 and sha1 may be quoted together (issue 32), but then the
        # sha1 values must be reported and match the signed digest
        quote = self.tpm.quote(self.qd, (16,))
        attest = TpmAttest.from_bytes(quote.attest)
        banks = attest.pcr_select + (t.PcrSelection(t.ALG_SHA1, (16,)),)
        self._assert_evidence("pcr_values", _resign(self.tpm, quote, pcr_select=banks))

    def test_quote_of_other_banks_is_rejected(self) -> None:
        quote = self.tpm.quote(self.qd, (16,))
        attest = TpmAttest.from_bytes(quote.attest)
        for extra in (t.ALG_SHA384, t.ALG_SHA256):
            banks = attest.pcr_select + (t.PcrSelection(extra, (16,)),)
            self._assert_evidence(
                "pcr_selection", _resign(self.tpm, quote, pcr_select=banks)
            )

    def test_quote_of_sha1_bank_is_rejected(self) -> None:
        quote = self.tpm.quote(self.qd, (16,))
        sha1 = (t.PcrSelection(t.ALG_SHA1, (16,)),)
        self._assert_evidence(
            "pcr_selection", _resign(self.tpm, quote, pcr_select=sha1)
        )

    def test_extra_quoted_pcrs_do_not_need_policy(self) -> None:
        self.tpm.extend(10, b"ima")
        verdict = self._verify(self.tpm.quote(self.qd, (10, 16)))
        self.assertEqual(
            {10: self.tpm.pcrs[10], 16: self.good16}, dict(verdict.pcr_values)
        )

    # -- clock

    def test_clock_rollback_is_rejected(self) -> None:
        quote = self.tpm.quote(self.qd, (16,))
        clock = TpmAttest.from_bytes(quote.attest).clock_info.clock
        later = ClockState(reset_count=0, restart_count=0, clock=clock + 1)
        self._assert_evidence("clock_rollback", quote, previous_clock=later)

    def test_reset_count_going_backwards_is_rejected(self) -> None:
        quote = self.tpm.quote(self.qd, (16,))
        previous = ClockState(reset_count=1, restart_count=0, clock=0)
        self._assert_evidence("clock_rollback", quote, previous_clock=previous)

    def test_restart_count_going_backwards_is_rejected(self) -> None:
        quote = self.tpm.quote(self.qd, (16,))
        previous = ClockState(reset_count=0, restart_count=1, clock=0)
        self._assert_evidence("clock_rollback", quote, previous_clock=previous)

    def test_unsafe_reboot_may_move_clock_back(self) -> None:
        self.tpm.reset_count = 3
        quote = self.tpm.quote(self.qd, (16,))
        info = TpmAttest.from_bytes(quote.attest).clock_info
        unsafe = dataclasses.replace(info, clock=5, safe=False)
        quote = _resign(self.tpm, quote, clock_info=unsafe)
        previous = ClockState(reset_count=2, restart_count=7, clock=10**9)
        verdict = self._verify(quote, previous_clock=previous)
        self.assertEqual(ClockState(3, 0, 5), verdict.clock)

    def test_reboot_after_unclean_stop_is_accepted(self) -> None:
        # The clock came back from its last NV save and ``safe`` is set
        # again by the time of the quote: a TPM Reset, not a rollback.
        self.tpm.reset_count = 3
        quote = self.tpm.quote(self.qd, (16,))
        info = TpmAttest.from_bytes(quote.attest).clock_info
        quote = _resign(self.tpm, quote, clock_info=dataclasses.replace(info, clock=5))
        previous = ClockState(reset_count=2, restart_count=0, clock=10**9)
        verdict = self._verify(quote, previous_clock=previous)
        self.assertEqual(ClockState(3, 0, 5), verdict.clock)

    def test_restart_after_unclean_stop_is_accepted(self) -> None:
        self.tpm.reset_count, self.tpm.restart_count = 2, 4
        quote = self.tpm.quote(self.qd, (16,))
        info = TpmAttest.from_bytes(quote.attest).clock_info
        quote = _resign(self.tpm, quote, clock_info=dataclasses.replace(info, clock=5))
        previous = ClockState(reset_count=2, restart_count=3, clock=10**9)
        verdict = self._verify(quote, previous_clock=previous)
        self.assertEqual(ClockState(2, 4, 5), verdict.clock)

    def test_replayed_older_state_is_rejected(self) -> None:
        # An older vTPM state restored: a lower resetCount, even with a
        # clock well ahead of the last accepted one.
        self.tpm.reset_count = 2
        quote = self.tpm.quote(self.qd, (16,))
        info = TpmAttest.from_bytes(quote.attest).clock_info
        later = dataclasses.replace(info, clock=10**10)
        quote = _resign(self.tpm, quote, clock_info=later)
        previous = ClockState(reset_count=3, restart_count=0, clock=10**9)
        self._assert_evidence("clock_rollback", quote, previous_clock=previous)

    def test_same_boot_lower_clock_is_rejected(self) -> None:
        self.tpm.reset_count, self.tpm.restart_count = 3, 1
        quote = self.tpm.quote(self.qd, (16,))
        info = TpmAttest.from_bytes(quote.attest).clock_info
        quote = _resign(self.tpm, quote, clock_info=dataclasses.replace(info, clock=5))
        previous = ClockState(reset_count=3, restart_count=1, clock=10**9)
        self._assert_evidence("clock_rollback", quote, previous_clock=previous)

    def test_clock_moving_forward_is_accepted(self) -> None:
        first = self._verify(self.tpm.quote(self.qd, (16,)))
        second = self._verify(
            self.tpm.quote(self.qd, (16,)), previous_clock=first.clock
        )
        self.assertGreater(second.clock.clock, first.clock.clock)

    # -- attestation key

    def test_ak_never_activated_is_rejected(self) -> None:
        quote = self.tpm.quote(self.qd, (16,))
        self._assert_evidence(
            "ak_not_activated", quote, ak=AttestationKey(self.tpm.ak, False)
        )

    def test_ak_that_can_decrypt_or_is_unrestricted_is_rejected(self) -> None:
        base = self.tpm.ak.attributes
        scheme = self.tpm.ak.scheme
        variants = {
            "decrypt": base | t.ATTR_DECRYPT,
            "unrestricted": base & ~t.ATTR_RESTRICTED,
            "not fixedTPM": base & ~t.ATTR_FIXED_TPM,
            "not fixedParent": base & ~t.ATTR_FIXED_PARENT,
            "not sign": base & ~t.ATTR_SIGN,
        }
        quote = self.tpm.quote(self.qd, (16,))
        for label, attrs in variants.items():
            public = t.make_public(self.tpm.ak_key.public_key(), attrs, scheme)
            exc = self.assertRaises(EvidenceError, check_ak_template, public)
            self.assertEqual("ak_template", exc.reason, label)
            # verify_quote refuses it too, even though the signature is good.
            self._assert_evidence(
                "ak_template", quote, ak=AttestationKey(public, activated=True)
            )
        check_ak_template(self.tpm.ak)  # the honest template passes

    def test_ak_with_or_without_no_da_is_accepted(self) -> None:
        # noDA is the agent's template (lockout cannot stop quotes); an AK
        # registered before it, without noDA, stays valid.
        self.assertTrue(self.tpm.ak.attributes & t.ATTR_NO_DA)
        scheme = self.tpm.ak.scheme
        without = self.tpm.ak.attributes & ~t.ATTR_NO_DA
        check_ak_template(t.make_public(self.tpm.ak_key.public_key(), without, scheme))
        check_ak_template(self.tpm.ak)

    # -- positive paths

    def test_ecc_ak_quote_verifies(self) -> None:
        verdict = self._verify(self.tpm.quote(self.qd, (16,)))
        self.assertTrue(verdict)
        self.assertEqual(t.ALG_ECC, self.tpm.ak.type)

    def test_rsa_ak_quote_verifies(self) -> None:
        tpm = _tpm("rsa")
        tpm.extend(16, b"measured boot of the node image")
        quote = tpm.quote(self.qd, (16,))
        self.assertEqual(t.ALG_RSASSA, TpmSignature.from_bytes(quote.signature).sig_alg)
        verdict = self._verify(quote, ak=AttestationKey(tpm.ak, True))
        self.assertTrue(verdict)
        self.assertEqual({16: self.good16}, dict(verdict.pcr_values))

    def test_verdict_carries_clock_state(self) -> None:
        self.tpm.reset_count = 4
        self.tpm.restart_count = 2
        verdict = self._verify(self.tpm.quote(self.qd, (16,)))
        self.assertIs(True, bool(verdict))
        self.assertEqual(ClockState(4, 2, self.tpm.clock), verdict.clock)
        self.assertEqual(self.qd, verdict.attest.extra_data)
        self.assertEqual(self.tpm.ak.name, verdict.attest.qualified_signer)
        self.assertEqual(verdict.clock, ClockState.from_dict(verdict.clock.to_dict()))

    def test_quote_dict_round_trip(self) -> None:
        quote = self.tpm.quote(self.qd, (0, 16, 23))
        wire = json.loads(json.dumps(quote.to_dict()))
        self.assertEqual({"attest", "signature", "pcrs"}, set(wire))
        self.assertEqual({"0", "16", "23"}, set(wire["pcrs"]))
        back = Quote.from_dict(wire)
        self.assertEqual(quote.attest, back.attest)
        self.assertEqual(quote.signature, back.signature)
        self.assertEqual(dict(quote.pcr_values), dict(back.pcr_values))
        self.assertTrue(self._verify(back))


class QuoteWireTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.wire = {
            "attest": base64.b64encode(b"attest").decode(),
            "signature": base64.b64encode(b"sig").decode(),
            "pcrs": {"16": "00" * 32},
        }

    def _malformed(self, data: object) -> MalformedError:
        return self.assertRaises(MalformedError, Quote.from_dict, data)

    def test_valid_wire_parses(self) -> None:
        quote = Quote.from_dict(self.wire)
        self.assertEqual(b"attest", quote.attest)
        self.assertEqual({16: bytes(32)}, dict(quote.pcr_values))

    def test_non_dict_is_malformed(self) -> None:
        for data in (None, [], "attest", 42, [("attest", "AA==")]):
            exc = self._malformed(data)
            self.assertEqual("quote", exc.structure)

    def test_bad_base64_is_malformed(self) -> None:
        for field in ("attest", "signature"):
            for value in ("not base64!", "QUJ", "A", None, 123, b"QUJD"):
                wire = dict(self.wire, **{field: value})
                exc = self._malformed(wire)
                self.assertIn(field, exc.detail)

    def test_missing_attest_is_malformed(self) -> None:
        del self.wire["attest"]
        self.assertIn("attest", self._malformed(self.wire).detail)

    def test_non_ascii_base64_is_malformed(self) -> None:
        # base64.b64decode raises a plain ValueError (not binascii.Error) for
        # non-ASCII str input, which quote._b64 does not catch.
        wire = dict(self.wire, attest="QUJD\u00e9")
        self._malformed(wire)

    def test_non_hex_pcr_is_malformed(self) -> None:
        for value in ("zz" * 32, "0", None, 16, ["00"]):
            wire = dict(self.wire, pcrs={"16": value})
            self._malformed(wire)

    def test_non_numeric_pcr_index_is_malformed(self) -> None:
        self._malformed(dict(self.wire, pcrs={"sixteen": "00" * 32}))

    def test_pcrs_not_an_object_is_malformed(self) -> None:
        for pcrs in (["00"], "00", None):
            self._malformed(dict(self.wire, pcrs=pcrs))

    def test_too_many_pcrs_is_malformed(self) -> None:
        pcrs = {str(i): "00" for i in range(25)}
        self._malformed(dict(self.wire, pcrs=pcrs))

    def test_oversized_attest_is_malformed(self) -> None:
        big = base64.b64encode(bytes(4097)).decode()
        self._malformed(dict(self.wire, attest=big))
