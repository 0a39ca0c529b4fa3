"""A software TPM 2.0 for unit tests and the fleet emulator.

It produces the same wire structures a real TPM does (TPM2B_PUBLIC,
TPMS_ATTEST, TPMT_SIGNATURE, TPM2_ActivateCredential), with keys held in
software. It is evidence generated honestly by a fake TPM; the functional
tests run the same code paths against swtpm.
"""

from __future__ import annotations

import hashlib
import hmac
import struct

from cryptography.hazmat.decrepit.ciphers.modes import CFB
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from verifier.protocol import _marshal as m
from verifier.protocol import tpm as t
from verifier.protocol.credential import kdfa, kdfe
from verifier.protocol.errors import EvidenceError
from verifier.protocol.quote import Quote, selection_for

AK_ATTRIBUTES = (
    t.ATTR_FIXED_TPM
    | t.ATTR_FIXED_PARENT
    | t.ATTR_SENSITIVE_DATA_ORIGIN
    | t.ATTR_USER_WITH_AUTH
    | t.ATTR_NO_DA
    | t.ATTR_RESTRICTED
    | t.ATTR_SIGN
)
_EK_ATTRS = (
    t.ATTR_FIXED_TPM
    | t.ATTR_FIXED_PARENT
    | t.ATTR_SENSITIVE_DATA_ORIGIN
    | t.ATTR_ADMIN_WITH_POLICY
    | t.ATTR_RESTRICTED
    | t.ATTR_DECRYPT
)
_EK_SYM = (t.ALG_AES, 128, t.ALG_CFB)
_ECDSA_SHA256 = ec.ECDSA(hashes.SHA256())
#: the firmware version the soft TPM reports in its quotes
FIRMWARE = 0x20240101
#: TPMS_CLOCK_INFO (clock, resetCount, restartCount, safe) + firmwareVersion
_CLOCK_FIRMWARE = struct.Struct(">QIIBQ")
#: TPMT_SIGNATURE of a P-256 ECDSA/SHA-256 signature up to r's size
_P256_SIZE = (32).to_bytes(2, "big")
_ECDSA_HEAD = (
    t.ALG_ECDSA.to_bytes(2, "big") + t.ALG_SHA256.to_bytes(2, "big") + _P256_SIZE
)


class SoftTpm:
    """An in-memory TPM with one EK, one AK and a sha256 PCR bank.

    Args:
        ak_alg: ``"ecc"`` (P-256, ECDSA) or ``"rsa"`` (2048, RSASSA).
        ek_alg: ``"rsa"`` or ``"ecc"``.
        ak_key: reuse a private key (the fleet emulator shares keys).
        ek_key: reuse a private key for the EK.
    """

    def __init__(
        self,
        ak_alg: str = "ecc",
        ek_alg: str = "rsa",
        ak_key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey | None = None,
        ek_key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey | None = None,
    ) -> None:
        self.ak_key = ak_key or _new_key(ak_alg)
        self.ek_key = ek_key or _new_key(ek_alg)
        if isinstance(self.ak_key, rsa.RSAPrivateKey):
            scheme = (t.ALG_RSASSA, t.ALG_SHA256)
        else:
            scheme = (t.ALG_ECDSA, t.ALG_SHA256)
        self.ak = t.make_public(self.ak_key.public_key(), AK_ATTRIBUTES, scheme)
        self.ek = t.make_public(
            self.ek_key.public_key(),
            _EK_ATTRS,
            (t.ALG_NULL, t.ALG_NULL),
            symmetric=_EK_SYM,
            auth_policy=bytes(32),
        )
        self._ak_name = self.ak.name  # quoted each time: computed once
        self._attest_head = (
            m.u32(t.TPM_GENERATED_VALUE)
            + m.u16(t.ST_ATTEST_QUOTE)
            + m.tpm2b(self._ak_name)
        )
        self._selections: dict[tuple[int, ...], tuple[t.PcrSelection, ...]] = {}
        self._tails: dict[tuple[int, ...], tuple[tuple[bytes, ...], bytes]] = {}
        self.pcrs = {i: bytes(32) for i in range(24)}
        #: the sha1 bank, extended only by :meth:`extend_sha1`.
        self.sha1_pcrs = {i: bytes(20) for i in range(24)}
        self.clock = 1000
        self.reset_count = 0
        self.restart_count = 0

    def extend(self, index: int, digest: bytes) -> None:
        self.pcrs[index] = hashlib.sha256(self.pcrs[index] + digest).digest()

    def extend_sha1(self, index: int, digest: bytes) -> None:
        """Extend PCR ``index`` of the sha1 bank with a 20-byte digest."""
        self.sha1_pcrs[index] = hashlib.sha1(
            self.sha1_pcrs[index] + digest, usedforsecurity=False
        ).digest()

    def quote(
        self,
        qualifying_data: bytes,
        pcrs: tuple[int, ...],
        banks: tuple[str, ...] = ("sha256",),
    ) -> Quote:
        """Quote ``pcrs`` (sha256 bank, and the sha1 bank too when ``banks``
        names it) with ``qualifying_data``.

        The TPMS_ATTEST is marshalled from parts kept between quotes (the
        fleet emulator quotes thousands of times a second on the cores the
        verifier under test needs): the head naming the AK, and per PCR
        selection and values the selection and digest that end it. The
        bytes are those :meth:`quote_structured` builds field by field.
        """
        if tuple(banks) != ("sha256",):
            return self.quote_structured(qualifying_data, pcrs, banks)
        self.clock += 17
        values, tail = self._quote_tail(pcrs)
        attest = b"".join(
            (
                self._attest_head,
                m.tpm2b(qualifying_data),
                _CLOCK_FIRMWARE.pack(
                    self.clock, self.reset_count, self.restart_count, 1, FIRMWARE
                ),
                tail,
            )
        )
        key = self.ak_key
        if isinstance(key, rsa.RSAPrivateKey):
            return Quote(attest, self.sign(attest).to_bytes(), values)
        r, s = decode_dss_signature(key.sign(attest, _ECDSA_SHA256))
        signature = (
            _ECDSA_HEAD + r.to_bytes(32, "big") + _P256_SIZE + s.to_bytes(32, "big")
        )
        return Quote(attest, signature, values)

    def _quote_tail(self, pcrs: tuple[int, ...]) -> tuple[dict[int, bytes], bytes]:
        """The quoted values and the attest's PCR selection + digest,
        remembered for the PCRs' present values (``pcrs`` may be assigned
        directly)."""
        selection = self._selections.get(pcrs)
        if selection is None:
            selection = self._selections[pcrs] = selection_for(pcrs)
        indexes = selection[0].pcrs
        current = tuple(self.pcrs[i] for i in indexes)
        cached = self._tails.get(pcrs)
        if cached is None or cached[0] != current:
            tail = t.PcrSelection.list_to_bytes(selection) + m.tpm2b(
                t.pcr_digest(t.ALG_SHA256, current)
            )
            cached = self._tails[pcrs] = (current, tail)
        return dict(zip(indexes, current, strict=True)), cached[1]

    def quote_structured(
        self,
        qualifying_data: bytes,
        pcrs: tuple[int, ...],
        banks: tuple[str, ...] = ("sha256",),
    ) -> Quote:
        """:meth:`quote` built field by field with :class:`TpmAttest`, for
        the test that the kept parts give the same bytes, and for quotes
        over more banks than sha256."""
        self.clock += 17
        selection = selection_for(pcrs, banks)
        values = {i: self.pcrs[i] for i in selection[0].pcrs}
        extra: dict[str, dict[int, bytes]] = {}
        if "sha1" in banks:
            extra["sha1"] = {i: self.sha1_pcrs[i] for i in selection[0].pcrs}
        quoted = list(values.values())
        quoted += [v for bank in extra.values() for v in bank.values()]
        attest = t.TpmAttest(
            magic=t.TPM_GENERATED_VALUE,
            type=t.ST_ATTEST_QUOTE,
            qualified_signer=self._ak_name,
            extra_data=qualifying_data,
            clock_info=t.ClockInfo(
                self.clock, self.reset_count, self.restart_count, True
            ),
            firmware_version=FIRMWARE,
            pcr_select=selection,
            pcr_digest=t.pcr_digest(t.ALG_SHA256, quoted),
        ).to_bytes()
        return Quote(attest, self.sign(attest).to_bytes(), values, extra)

    def sign(self, data: bytes) -> t.TpmSignature:
        key = self.ak_key
        if isinstance(key, rsa.RSAPrivateKey):
            sig = key.sign(data, padding.PKCS1v15(), hashes.SHA256())
            return t.TpmSignature(t.ALG_RSASSA, t.ALG_SHA256, sig=sig)
        r, s = decode_dss_signature(key.sign(data, _ECDSA_SHA256))
        return t.TpmSignature(
            t.ALG_ECDSA, t.ALG_SHA256, r=r.to_bytes(32, "big"), s=s.to_bytes(32, "big")
        )

    def activate_credential(
        self, credential_blob: bytes, encrypted_secret: bytes
    ) -> bytes:
        """TPM2_ActivateCredential in software for this TPM's AK.

        Raises:
            EvidenceError: ``credential`` if the blob is not for this EK/AK.
        """
        seed = self._recover_seed(m.Reader(encrypted_secret, "secret").tpm2b())
        r = m.Reader(m.Reader(credential_blob, "id object").tpm2b(), "id object")
        outer = r.tpm2b()
        enc_identity = r.raw(len(credential_blob) - 2 - 2 - len(outer))
        name = self.ak.name
        hmac_key = kdfa("sha256", seed, b"INTEGRITY", b"", b"", 256)
        expected = hmac.new(hmac_key, enc_identity + name, "sha256").digest()
        if not hmac.compare_digest(expected, outer):
            raise EvidenceError("credential", "integrity check failed")
        sym = kdfa("sha256", seed, b"STORAGE", name, b"", 128)
        dec = Cipher(algorithms.AES(sym), CFB(bytes(16))).decryptor()
        plain = dec.update(enc_identity) + dec.finalize()
        return m.Reader(plain, "credential").tpm2b()

    def _recover_seed(self, secret: bytes) -> bytes:
        key = self.ek_key
        if isinstance(key, rsa.RSAPrivateKey):
            h = hashes.SHA256()
            return key.decrypt(
                secret, padding.OAEP(padding.MGF1(h), h, b"IDENTITY\x00")
            )
        r = m.Reader(secret, "ecc point")
        x, y = r.tpm2b(), r.tpm2b()
        point = ec.EllipticCurvePublicNumbers(
            int.from_bytes(x, "big"), int.from_bytes(y, "big"), key.curve
        ).public_key()
        z = key.exchange(ec.ECDH(), point)
        return kdfe("sha256", z, b"IDENTITY", x, self.ek.unique[0], 256)


def _new_key(alg: str) -> ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey:
    if alg == "ecc":
        return ec.generate_private_key(ec.SECP256R1())
    if alg == "rsa":
        return rsa.generate_private_key(65537, 2048)
    raise ValueError(f"unknown key algorithm {alg!r}")
