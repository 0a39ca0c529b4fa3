"""Keys that sign files for IMA appraisal, and IMA signature checking.

Signature format v2 (``struct signature_v2_hdr`` in
``security/integrity/integrity.h``, same in ima-evm-utils ``imaevm.h``):
u8 type (0x03, ``EVM_IMA_XATTR_DIGSIG``), u8 version (0x02), u8 hash
algorithm (``enum hash_algo``), big-endian u32 key id, big-endian u16
signature size, then the signature over the file digest itself (RSA
PKCS#1 v1.5 or DER ECDSA). Version 3 (signing an ``ima_file_id``) is not
supported and never verifies.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
from collections.abc import Iterable
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import Prehashed

from verifier.protocol.errors import MalformedError

__all__ = ["ImaKey", "PublicKey", "verify_ima_signature"]

_STRUCT = "IMA runtime policy"
PublicKey = rsa.RSAPublicKey | ec.EllipticCurvePublicKey
# enum hash_algo (include/uapi/linux/hash_info.h) -> cryptography hash.
_SIG_HASHES: dict[int, tuple[str, type[hashes.HashAlgorithm]]] = {
    2: ("sha1", hashes.SHA1),
    4: ("sha256", hashes.SHA256),
    5: ("sha384", hashes.SHA384),
    6: ("sha512", hashes.SHA512),
    7: ("sha224", hashes.SHA224),
}


def _bad(detail: str) -> MalformedError:
    return MalformedError(_STRUCT, detail)


@dataclasses.dataclass(frozen=True, slots=True)
class ImaKey:
    """A public key that may sign files (IMA signature format v2).

    Attributes:
        keyid: the 4-byte key id in signatures; by default the last 4 bytes
            of SHA-1 of the subjectPublicKey bits (the RFC 5280 method 1
            subject key identifier ``evmctl`` and the kernel use).
        public_key: an RSA or ECDSA public key.
    """

    keyid: bytes
    public_key: PublicKey

    @classmethod
    def from_public_key(cls, key: PublicKey, keyid: bytes | None = None) -> ImaKey:
        """Wrap ``key``, computing its default key id unless given."""
        if keyid is None:
            if isinstance(key, rsa.RSAPublicKey):
                bits = key.public_bytes(
                    serialization.Encoding.DER, serialization.PublicFormat.PKCS1
                )
            else:
                bits = key.public_bytes(
                    serialization.Encoding.X962,
                    serialization.PublicFormat.UncompressedPoint,
                )
            keyid = hashlib.sha1(bits, usedforsecurity=False).digest()[-4:]
        if len(keyid) != 4:
            raise _bad("key id must be 4 bytes")
        return cls(keyid, key)

    @classmethod
    def from_dict(cls, data: Any) -> ImaKey:
        """Parse ``{"public_key": base64 DER SPKI, "keyid": hex}``."""
        if not isinstance(data, dict) or not isinstance(data.get("public_key"), str):
            raise _bad("key must be an object with a base64 public_key")
        try:
            der = base64.b64decode(data["public_key"], validate=True)
            key = serialization.load_der_public_key(der)
            keyid = data.get("keyid")
            kid = bytes.fromhex(keyid) if isinstance(keyid, str) else None
        except (ValueError, binascii.Error) as exc:
            raise _bad(f"bad key: {exc}") from None
        if not isinstance(key, rsa.RSAPublicKey | ec.EllipticCurvePublicKey):
            raise _bad("IMA keys must be RSA or ECDSA")
        return cls.from_public_key(key, kid)

    def to_dict(self) -> dict[str, str]:
        """The JSON form."""
        der = self.public_key.public_bytes(
            serialization.Encoding.DER,
            serialization.PublicFormat.SubjectPublicKeyInfo,
        )
        return {"public_key": base64.b64encode(der).decode(), "keyid": self.keyid.hex()}


def verify_ima_signature(
    signature: bytes, algorithm: str, digest: bytes, keys: Iterable[ImaKey]
) -> bool:
    """Whether ``signature`` (v2 format) signs ``digest`` with one of ``keys``.

    The signature's hash algorithm must be the file digest's ``algorithm``.
    """
    if len(signature) < 9 or signature[0] != 3 or signature[1] != 2:
        return False
    hash_info = _SIG_HASHES.get(signature[2])
    if hash_info is None or hash_info[0] != algorithm:
        return False
    keyid = signature[3:7]
    size = int.from_bytes(signature[7:9], "big")
    body = signature[9:]
    if size != len(body):
        return False
    prehashed = Prehashed(hash_info[1]())
    for key in keys:
        if key.keyid != keyid:
            continue
        try:
            if isinstance(key.public_key, rsa.RSAPublicKey):
                key.public_key.verify(body, digest, padding.PKCS1v15(), prehashed)
            else:
                key.public_key.verify(body, digest, ec.ECDSA(prehashed))
        except (InvalidSignature, ValueError):
            continue
        return True
    return False
