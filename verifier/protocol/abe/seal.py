"""Policy sealing: hybrid CP-ABE (BSW07 over BLS12-381) + AES-256-GCM.

:func:`seal` encapsulates a random GT element ``Y^s`` under the policy with
Bethencourt-Sahai-Waters 2007 CP-ABE ("Ciphertext-Policy Attribute-Based
Encryption"; BLS12-381, about 120-bit security), derives a 256-bit key with
HKDF-SHA256 from its canonical encoding, and encrypts the payload with
AES-256-GCM. The associated data binds a context label, the public
parameters id, the policy string, the full ABE ciphertext (so a flipped bit
anywhere fails, even in a leaf the opener does not use) and the caller's
``aad``.

Sealed blob (``KIND_SEALED``)::

    MAGIC "TCABE" || version 1 || kind 5
    || u32 len || ABE ciphertext || u32 len || nonce (12) || u32 len || GCM output
"""

from __future__ import annotations

import functools
import hashlib
import os
import struct

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from verifier.protocol.abe import _codec as c
from verifier.protocol.abe.bsw07 import (
    Ciphertext,
    PublicParams,
    SecretKey,
    decapsulate,
    encapsulate,
)
from verifier.protocol.abe.errors import SealIntegrityError
from verifier.protocol.errors import MalformedError

__all__ = ["HKDF_INFO", "SealedBlob", "seal", "unseal"]

HKDF_INFO = b"trusted-cloud abe v1"
_AAD_LABEL = b"trusted-cloud abe seal v1"
_NONCE = 12
_MAX_PAYLOAD = 1 << 30


def _lp(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def _aad(pp_id: bytes, ct: Ciphertext, ct_bytes: bytes, aad: bytes) -> bytes:
    return b"".join(
        (
            _lp(_AAD_LABEL),
            _lp(pp_id),
            _lp(ct.policy.encode("utf-8")),
            _lp(hashlib.sha256(ct_bytes).digest()),
            _lp(aad),
        )
    )


def _derive(key_gt_bytes: bytes, pp_id: bytes) -> bytes:
    return HKDF(
        algorithm=hashes.SHA256(), length=32, salt=pp_id, info=HKDF_INFO
    ).derive(key_gt_bytes)


class SealedBlob:
    """A parsed sealed blob (ABE ciphertext, nonce, GCM output)."""

    def __init__(self, ct_bytes: bytes, nonce: bytes, body: bytes) -> None:
        self.ct_bytes = ct_bytes
        self.nonce = nonce
        self.body = body

    @functools.cached_property
    def ciphertext(self) -> Ciphertext:
        """The ABE ciphertext (decoded and validated)."""
        return Ciphertext.from_bytes(self.ct_bytes)

    def to_bytes(self) -> bytes:
        """Canonical encoding."""
        w = c.Writer(c.KIND_SEALED)
        w.blob(self.ct_bytes)
        w.blob(self.nonce)
        w.blob(self.body)
        return w.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> SealedBlob:
        """Decode; raises MalformedError on any defect."""
        r = c.Reader(data, c.KIND_SEALED, "sealed blob")
        ct_bytes = r.blob("ABE ciphertext", 1 << 24)
        nonce = r.blob("nonce", _NONCE)
        if len(nonce) != _NONCE:
            raise MalformedError(r.structure, "nonce is not 12 bytes")
        body = r.blob("payload", _MAX_PAYLOAD + 16)
        if len(body) < 16:
            raise MalformedError(r.structure, "payload shorter than the GCM tag")
        r.end()
        blob = cls(ct_bytes, nonce, body)
        blob.ciphertext  # noqa: B018 - validate eagerly
        return blob


def seal(pp: PublicParams, policy: str, payload: bytes, aad: bytes = b"") -> bytes:
    """Seal ``payload`` so that only keys satisfying ``policy`` open it.

    Args:
        pp: the public parameters.
        policy: policy string (see :mod:`verifier.protocol.abe.policy`).
        payload: bytes to protect (at most 1 GiB).
        aad: associated data the opener must present unchanged.

    Returns:
        The sealed blob.

    Raises:
        PolicyError: the policy does not parse.
        ValueError: payload or aad are not bytes, or payload is too long.
    """
    if not isinstance(payload, bytes | bytearray) or not isinstance(
        aad, bytes | bytearray
    ):
        raise ValueError("payload and aad must be bytes")
    if len(payload) > _MAX_PAYLOAD:
        raise ValueError("payload too long")
    key_gt, ct = encapsulate(pp, policy)
    ct_bytes = ct.to_bytes()
    nonce = os.urandom(_NONCE)
    key = _derive(key_gt.serialize(), pp.id)
    body = AESGCM(key).encrypt(nonce, bytes(payload), _aad(pp.id, ct, ct_bytes, aad))
    return SealedBlob(ct_bytes, nonce, body).to_bytes()


def unseal(pp: PublicParams, sk: SecretKey, blob: bytes, aad: bytes = b"") -> bytes:
    """Open a sealed blob with a key whose attributes satisfy its policy.

    Args:
        pp: the public parameters.
        sk: the node's secret key.
        blob: output of :func:`seal`.
        aad: the associated data given to :func:`seal`.

    Returns:
        The payload.

    Raises:
        MalformedError: the blob does not decode.
        AbeError: the key does not satisfy the policy, or the key or blob is
            for other public parameters.
        SealIntegrityError: the payload does not authenticate (tampering,
            other aad, or a forged/combined key).
    """
    parsed = SealedBlob.from_bytes(blob)
    ct = parsed.ciphertext
    key_gt = decapsulate(pp, sk, ct)
    key = _derive(key_gt.serialize(), pp.id)
    try:
        return AESGCM(key).decrypt(
            parsed.nonce, parsed.body, _aad(pp.id, ct, parsed.ct_bytes, bytes(aad))
        )
    except InvalidTag:
        raise SealIntegrityError(
            "sealed payload does not authenticate (tampered, other associated "
            "data, or a key that does not match)"
        )
