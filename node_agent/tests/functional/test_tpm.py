"""Functional tests of verifier.common.tpm against a real swtpm (no mocks)."""

import hashlib
import os

import fixtures
import testtools
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
from tpm2_pytss import (
    ESAPI,
    ESYS_TR,
    TPM2_ALG,
    TPM2_RC,
    TPM2_RH,
    TPM2_SE,
    TPM2_ST,
    TPM2B_AUTH,
    TPM2B_DIGEST,
    TPM2B_PUBLIC,
    TPM2B_SENSITIVE_CREATE,
    TPMA_OBJECT,
    TPMS_ATTEST,
    TPMS_SENSITIVE_CREATE,
    TPMT_SIG_SCHEME,
    TPMT_SIGNATURE,
    TPMT_SYM_DEF,
    TPMT_TK_HASHCHECK,
    TSS2_Exception,
)
from tpm2_pytss.utils import make_credential

from node_agent.exceptions import TpmError
from trusted_testing.swtpm import Swtpm, free_port_pair
from trusted_testing.swtpm_case import SwtpmTestCase
from verifier.common.tpm import Tpm

TPM_GENERATED_VALUE = 0xFF544347


def _ak_name(ak_public: bytes) -> bytes:
    """TPM name of a key: nameAlg (SHA-256) || SHA-256(TPMT_PUBLIC)."""
    pub, _ = TPM2B_PUBLIC.unmarshal(ak_public)
    return b"\x00\x0b" + hashlib.sha256(pub.publicArea.marshal()).digest()


def _ecc_key(
    public: TPM2B_PUBLIC, curve: ec.EllipticCurve
) -> ec.EllipticCurvePublicKey:
    point = public.publicArea.unique.ecc
    return ec.EllipticCurvePublicNumbers(
        int.from_bytes(bytes(point.x), "big"),
        int.from_bytes(bytes(point.y), "big"),
        curve,
    ).public_key()


def _rsa_key(public: TPM2B_PUBLIC) -> rsa.RSAPublicKey:
    exponent = public.publicArea.parameters.rsaDetail.exponent or 65537
    modulus = int.from_bytes(bytes(public.publicArea.unique.rsa), "big")
    return rsa.RSAPublicNumbers(exponent, modulus).public_key()


def _verify_chain(cert: x509.Certificate, bundle: bytes) -> None:
    """Verify cert -> issuer -> (self-signed) root using the PEM bundle."""
    cas = x509.load_pem_x509_certificates(bundle)
    by_subject = {ca.subject: ca for ca in cas}
    current, steps = cert, 0
    while True:
        issuer = by_subject[current.issuer]
        current.verify_directly_issued_by(issuer)
        steps += 1
        if issuer.issuer == issuer.subject:
            issuer.verify_directly_issued_by(issuer)
            break
        current = issuer
    assert steps >= 1


class TestTpmOnSwtpm(SwtpmTestCase):
    """Exercise the TPM layer against one swtpm shared by the class."""

    prefix = "test-tpm-"

    def _tpm(self, **kwargs):
        tpm = Tpm(self.swtpm.tcti, **kwargs)
        self.addCleanup(tpm.close)
        return tpm

    def _check_quote(self, tpm, verify):
        nonce = os.urandom(32)
        quote = tpm.quote(nonce, [16])
        attest, _ = TPMS_ATTEST.unmarshal(quote.attest)
        self.assertEqual(TPM_GENERATED_VALUE, int(attest.magic))
        self.assertEqual(TPM2_ST.ATTEST_QUOTE, attest.type)
        self.assertEqual(0x8018, int(attest.type))
        self.assertEqual(nonce, bytes(attest.extraData))
        self.assertEqual([16], sorted(quote.pcr_values))
        expected = hashlib.sha256(quote.pcr_values[16]).digest()
        self.assertEqual(expected, bytes(attest.attested.quote.pcrDigest))
        signature, _ = TPMT_SIGNATURE.unmarshal(quote.signature)
        ak, _ = TPM2B_PUBLIC.unmarshal(tpm.ak_public())
        verify(ak, signature, quote.attest)

    def test_ek_public_matches_certificate(self):
        tpm = self._tpm()
        ek, consumed = TPM2B_PUBLIC.unmarshal(tpm.ek_public())
        self.assertEqual(len(tpm.ek_public()), consumed)
        self.assertEqual(TPM2_ALG.RSA, ek.publicArea.type)
        cert = x509.load_der_x509_certificate(tpm.ek_certificate())
        cert_key = cert.public_key()
        self.assertIsInstance(cert_key, rsa.RSAPublicKey)
        self.assertEqual(
            int.from_bytes(bytes(ek.publicArea.unique.rsa), "big"),
            cert_key.public_numbers().n,
        )
        _verify_chain(cert, Swtpm.ek_ca_bundle(self.ca_dir))

    def test_activate_credential(self):
        tpm = self._tpm()
        ek, _ = TPM2B_PUBLIC.unmarshal(tpm.ek_public())
        secret = os.urandom(32)
        blob, enc = make_credential(ek, secret, _ak_name(tpm.ak_public()))
        self.assertEqual(secret, tpm.activate_credential(blob.marshal(), enc.marshal()))

    def test_activate_credential_wrong_ak_name(self):
        tpm = self._tpm()
        ek, _ = TPM2B_PUBLIC.unmarshal(tpm.ek_public())
        other_name = b"\x00\x0b" + os.urandom(32)
        blob, enc = make_credential(ek, os.urandom(32), other_name)
        self.assertRaises(
            TpmError, tpm.activate_credential, blob.marshal(), enc.marshal()
        )
        # The TPM stays usable after the failure.
        blob, enc = make_credential(ek, b"ok" * 16, _ak_name(tpm.ak_public()))
        self.assertEqual(
            b"ok" * 16, tpm.activate_credential(blob.marshal(), enc.marshal())
        )

    def test_quote_ecdsa(self):
        def verify(ak, signature, attest):
            self.assertEqual(TPM2_ALG.ECDSA, signature.sigAlg)
            ecdsa = signature.signature.ecdsa
            self.assertEqual(TPM2_ALG.SHA256, ecdsa.hash)
            der = encode_dss_signature(
                int.from_bytes(bytes(ecdsa.signatureR), "big"),
                int.from_bytes(bytes(ecdsa.signatureS), "big"),
            )
            key = _ecc_key(ak, ec.SECP256R1())
            key.verify(der, attest, ec.ECDSA(hashes.SHA256()))

        self._check_quote(self._tpm(), verify)

    def test_quote_rsa_ak(self):
        def verify(ak, signature, attest):
            self.assertEqual(TPM2_ALG.RSASSA, signature.sigAlg)
            self.assertEqual(TPM2_ALG.SHA256, signature.signature.rsassa.hash)
            sig = bytes(signature.signature.rsassa.sig)
            _rsa_key(ak).verify(sig, attest, padding.PKCS1v15(), hashes.SHA256())

        tpm = self._tpm(ak_alg="rsa")
        self._check_quote(tpm, verify)
        ek, _ = TPM2B_PUBLIC.unmarshal(tpm.ek_public())
        blob, enc = make_credential(ek, b"r" * 32, _ak_name(tpm.ak_public()))
        self.assertEqual(
            b"r" * 32, tpm.activate_credential(blob.marshal(), enc.marshal())
        )

    def test_pcr_extend(self):
        tpm = self._tpm()
        old = tpm.pcr_read([16])[16]
        digest = hashlib.sha256(b"measurement").digest()
        tpm.pcr_extend(16, digest)
        self.assertEqual(
            {16: hashlib.sha256(old + digest).digest()}, tpm.pcr_read([16])
        )
        quote = tpm.quote(b"\x00" * 32, [16])
        self.assertEqual(tpm.pcr_read([16]), quote.pcr_values)

    def test_ak_is_deterministic(self):
        with Tpm(self.swtpm.tcti) as tpm:
            first = tpm.ak_public()
        self.assertEqual(first, self._tpm().ak_public())

    def test_ecc_ek(self):
        tpm = self._tpm(ek_alg="ecc")
        cert_der = tpm.ek_certificate()
        if cert_der is None:
            self.skipTest("swtpm_setup wrote no ECC EK certificate")
        ek, _ = TPM2B_PUBLIC.unmarshal(tpm.ek_public())
        self.assertEqual(TPM2_ALG.ECC, ek.publicArea.type)
        cert = x509.load_der_x509_certificate(cert_der)
        cert_key = cert.public_key()
        self.assertIsInstance(cert_key, ec.EllipticCurvePublicKey)
        self.assertEqual(
            cert_key.public_numbers(),
            _ecc_key(ek, cert_key.curve).public_numbers(),
        )
        _verify_chain(cert, Swtpm.ek_ca_bundle(self.ca_dir))
        secret = os.urandom(32)
        blob, enc = make_credential(ek, secret, _ak_name(tpm.ak_public()))
        self.assertEqual(secret, tpm.activate_credential(blob.marshal(), enc.marshal()))

    def test_open_flushes_stale_handles(self):
        ctx = ESAPI(self.swtpm.tcti)
        try:
            ctx.create_primary(None, "ecc256")
            ctx.start_auth_session(
                ESYS_TR.NONE,
                ESYS_TR.NONE,
                TPM2_SE.HMAC,
                TPMT_SYM_DEF(algorithm=TPM2_ALG.NULL),
                TPM2_ALG.SHA256,
            )
        finally:
            ctx.close()
        tpm = self._tpm()
        self.assertEqual([], tpm._handles(0x80000000))
        self.assertEqual([], tpm._handles(0x02000000))
        self.assertEqual(32, len(tpm.quote(b"x", [0, 16]).pcr_values[0]))

    def test_quote_all_pcrs(self):
        # More than 8 PCRs need several TPM2_PCR_Read calls.
        tpm = self._tpm()
        quote = tpm.quote(b"all", range(24))
        attest, _ = TPMS_ATTEST.unmarshal(quote.attest)
        values = b"".join(quote.pcr_values[i] for i in range(24))
        self.assertEqual(
            hashlib.sha256(values).digest(), bytes(attest.attested.quote.pcrDigest)
        )


def _private_swtpm(case: testtools.TestCase) -> Swtpm:
    """A started swtpm of ``case``'s own (stopped at its cleanup)."""
    tmp = case.useFixture(fixtures.TempDir()).path
    swtpm = Swtpm(
        os.path.join(tmp, "state"), free_port_pair(), os.path.join(tmp, "localca")
    )
    swtpm.start()
    case.addCleanup(swtpm.stop)
    return swtpm


class TestTpmSwtpmStopped(testtools.TestCase):
    """A TPM that goes away yields TpmError, never a raw TSS2_Exception."""

    def test_quote_after_stop_raises_tpm_error(self):
        swtpm = _private_swtpm(self)
        tpm = Tpm(swtpm.tcti)
        self.addCleanup(tpm.close)
        first_ek, first_ak = tpm.ek_public(), tpm.ak_public()
        swtpm.stop()
        self.assertFalse(swtpm.running)
        error = self.assertRaises(TpmError, tpm.quote, b"n" * 32, [16])
        self.assertIn("quote", str(error))
        self.assertRaises(TpmError, Tpm, swtpm.tcti)
        # Restarting reuses the manufactured state: same EK, same AK.
        swtpm.start()
        with Tpm(swtpm.tcti) as again:
            self.assertEqual(first_ek, again.ek_public())
            self.assertEqual(first_ak, again.ak_public())

    def test_start_failure_reports_log(self):
        tmp = self.useFixture(fixtures.TempDir()).path
        port = free_port_pair()
        first = Swtpm(os.path.join(tmp, "a"), port, os.path.join(tmp, "ca"))
        first.start()
        self.addCleanup(first.stop)
        second = Swtpm(os.path.join(tmp, "b"), port, os.path.join(tmp, "ca"))
        self.addCleanup(second.stop)
        error = self.assertRaises(TpmError, second.start)
        self.assertIn("in use", str(error))


class TestAkSurvivesLockout(testtools.TestCase):
    """The AK is noDA: a TPM in dictionary-attack lockout still quotes."""

    def test_ak_has_no_da_and_quotes_in_lockout(self):
        swtpm = _private_swtpm(self)
        tpm = Tpm(swtpm.tcti)
        self.addCleanup(tpm.close)
        ak, _ = TPM2B_PUBLIC.unmarshal(tpm.ak_public())
        self.assertTrue(ak.publicArea.objectAttributes & TPMA_OBJECT.NODA)
        ctx = tpm.ctx
        # One failed authorisation locks the TPM out.
        ctx.dictionary_attack_parameters(1, 3600, 3600, ESYS_TR.LOCKOUT)
        template = TPM2B_PUBLIC.parse(
            "ecc256:ecdsa-sha256",
            TPMA_OBJECT.USERWITHAUTH
            | TPMA_OBJECT.SIGN_ENCRYPT
            | TPMA_OBJECT.FIXEDTPM
            | TPMA_OBJECT.FIXEDPARENT
            | TPMA_OBJECT.SENSITIVEDATAORIGIN,
        )
        sensitive = TPM2B_SENSITIVE_CREATE(
            TPMS_SENSITIVE_CREATE(userAuth=TPM2B_AUTH(b"right"))
        )
        key, _, _, _, _ = ctx.create_primary(sensitive, template, ESYS_TR.OWNER)
        self.addCleanup(ctx.flush_context, key)
        ctx.tr_set_auth(key, b"wrong")
        digest = TPM2B_DIGEST(b"d" * 32)
        ticket = TPMT_TK_HASHCHECK(tag=TPM2_ST.HASHCHECK, hierarchy=TPM2_RH.NULL)
        scheme = TPMT_SIG_SCHEME(scheme=TPM2_ALG.NULL)
        failed = self.assertRaises(
            TSS2_Exception, ctx.sign, key, digest, scheme, ticket
        )
        self.assertEqual(TPM2_RC.AUTH_FAIL, failed.error)
        ctx.tr_set_auth(key, b"right")
        locked = self.assertRaises(
            TSS2_Exception, ctx.sign, key, digest, scheme, ticket
        )
        self.assertEqual(TPM2_RC.LOCKOUT, locked.error)
        quote = tpm.quote(b"n" * 32, [16])
        attest, _ = TPMS_ATTEST.unmarshal(quote.attest)
        self.assertEqual(b"n" * 32, bytes(attest.extraData))
