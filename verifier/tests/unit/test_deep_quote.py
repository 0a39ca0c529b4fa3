"""Deep quotes (vTPM quote + host quote binding it), one test per attack."""

from __future__ import annotations

import hashlib
import os
import uuid as uuid_mod

import testtools

from trusted_testing.softtpm import SoftTpm
from verifier.protocol import EvidenceError
from verifier.protocol.deepquote import (
    DeepQuote,
    host_binding,
    verify_deep_quote,
)
from verifier.protocol.policy import PcrPolicy
from verifier.protocol.quote import AttestationKey, bind_nonce

PCR = 16
BOOT = hashlib.sha256(b"host boot").digest()
GUEST = hashlib.sha256(b"guest boot").digest()


class DeepQuoteTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.vtpm = SoftTpm(ak_alg="ecc", ek_alg="rsa")
        self.host = SoftTpm(ak_alg="ecc", ek_alg="rsa")
        self.vtpm.extend(PCR, GUEST)
        self.host.extend(PCR, BOOT)
        self.instance = str(uuid_mod.uuid4())
        self.nonce = os.urandom(20)

    def deep_quote(
        self,
        nonce: bytes | None = None,
        instance: str | None = None,
        ek_name: bytes | None = None,
        host: SoftTpm | None = None,
    ) -> DeepQuote:
        nonce = nonce or self.nonce
        vq = self.vtpm.quote(bind_nonce(nonce), (PCR,))
        binding = host_binding(
            nonce,
            ek_name or self.vtpm.ek.name,
            instance or self.instance,
            vq.attest,
        )
        return DeepQuote(vq, (host or self.host).quote(binding, (PCR,)))

    def verify(self, deep: DeepQuote, nonce: bytes | None = None) -> object:
        return verify_deep_quote(
            DeepQuote.from_dict(deep.to_dict()),
            nonce=nonce or self.nonce,
            instance_uuid=self.instance,
            vtpm_ek=self.vtpm.ek,
            vtpm_ak=AttestationKey(self.vtpm.ak, True),
            vtpm_policy=PcrPolicy({PCR: frozenset({self.vtpm.pcrs[PCR]})}),
            host_ak=AttestationKey(self.host.ak, True),
            host_policy=PcrPolicy({PCR: frozenset({self.host.pcrs[PCR]})}),
        )

    def assert_refused(self, deep: DeepQuote, reason: str, **kw: bytes) -> None:
        with self.assertRaises(EvidenceError) as ctx:
            self.verify(deep, **kw)
        self.assertEqual(reason, ctx.exception.reason)

    def test_good_deep_quote_verifies(self) -> None:
        verdict = self.verify(self.deep_quote())
        self.assertTrue(verdict)

    def test_host_quote_for_another_instance_uuid_is_rejected(self) -> None:
        deep = self.deep_quote(instance=str(uuid_mod.uuid4()))
        self.assert_refused(deep, "deep_quote_binding")

    def test_host_quote_binding_another_vtpm_ek_name_is_rejected(self) -> None:
        other = SoftTpm(ak_alg="ecc", ek_alg="rsa")
        deep = self.deep_quote(ek_name=other.ek.name)
        self.assert_refused(deep, "deep_quote_binding")

    def test_replayed_host_quote_with_old_nonce_is_rejected(self) -> None:
        old = self.deep_quote(nonce=os.urandom(20))
        fresh_vtpm = self.vtpm.quote(bind_nonce(self.nonce), (PCR,))
        self.assert_refused(DeepQuote(fresh_vtpm, old.host), "deep_quote_binding")

    def test_replayed_deep_quote_with_old_nonce_is_rejected(self) -> None:
        old = self.deep_quote(nonce=os.urandom(20))
        self.assert_refused(old, "nonce_mismatch")

    def test_host_quote_paired_with_another_vtpm_quote_is_rejected(self) -> None:
        deep = self.deep_quote()
        self.vtpm.extend(PCR, GUEST)  # a later, different vTPM quote
        vq = self.vtpm.quote(bind_nonce(self.nonce), (PCR,))
        with self.assertRaises(EvidenceError) as ctx:
            verify_deep_quote(
                DeepQuote(vq, deep.host),
                nonce=self.nonce,
                instance_uuid=self.instance,
                vtpm_ek=self.vtpm.ek,
                vtpm_ak=AttestationKey(self.vtpm.ak, True),
                vtpm_policy=PcrPolicy({PCR: frozenset({self.vtpm.pcrs[PCR]})}),
                host_ak=AttestationKey(self.host.ak, True),
                host_policy=PcrPolicy({PCR: frozenset({self.host.pcrs[PCR]})}),
            )
        self.assertEqual("deep_quote_binding", ctx.exception.reason)

    def test_host_quote_signed_by_another_tpm_is_rejected(self) -> None:
        rogue = SoftTpm(ak_alg="ecc")
        rogue.extend(PCR, BOOT)
        self.assert_refused(self.deep_quote(host=rogue), "signature_invalid")

    def test_host_with_untrusted_boot_is_rejected(self) -> None:
        deep = self.deep_quote()
        good = self.host.pcrs[PCR]
        self.host.extend(PCR, b"\x01" * 32)
        bad = self.deep_quote()
        self.host.pcrs[PCR] = good  # the policy keeps the good value
        self.assertTrue(self.verify(deep))
        self.assert_refused(bad, "pcr_policy")
