"""Software TPM2_MakeCredential (TPM 2.0 Part 1, 24 "Credential Protection";
Part 3, 12.6) for RSA and ECC endorsement keys.

The registrar wraps a random credential for an AK Name under the EK; only
the TPM holding both keys can recover it with TPM2_ActivateCredential.

* RSA EK: the seed is encrypted with RSA-OAEP(nameAlg, label "IDENTITY").
* ECC EK: the seed is KDFe over an ephemeral ECDH shared secret and the
  encrypted secret is the ephemeral public point.
* symKey = KDFa(nameAlg, seed, "STORAGE", Name, "", keyBits);
  encIdentity = CFB(symKey, IV=0, TPM2B(credential));
  HMACkey = KDFa(nameAlg, seed, "INTEGRITY", "", "", digest bits);
  outerHMAC = HMAC(HMACkey, encIdentity || Name).
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import os
from collections.abc import Callable

from cryptography.hazmat.decrepit.ciphers.modes import CFB
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from verifier.protocol import _marshal as m
from verifier.protocol.errors import EvidenceError
from verifier.protocol.tpm import (
    ALG_AES,
    ALG_CFB,
    ATTR_DECRYPT,
    ATTR_FIXED_PARENT,
    ATTR_FIXED_TPM,
    ATTR_RESTRICTED,
    TpmPublic,
    hash_for_alg,
)

__all__ = [
    "CredentialChallenge",
    "check_ek_template",
    "kdfa",
    "kdfe",
    "make_credential",
]

_EK_ATTRS = ATTR_FIXED_TPM | ATTR_FIXED_PARENT | ATTR_RESTRICTED | ATTR_DECRYPT
_HASH_CLASSES: dict[str, Callable[[], hashes.HashAlgorithm]] = {
    "sha256": hashes.SHA256,
    "sha384": hashes.SHA384,
    "sha512": hashes.SHA512,
    "sha1": hashes.SHA1,
}


def kdfa(
    hash_name: str,
    key: bytes,
    label: bytes,
    context_u: bytes,
    context_v: bytes,
    bits: int,
) -> bytes:
    """KDFa (Part 1, 11.4.10.2): SP 800-108 counter-mode HMAC KDF."""
    out = b""
    counter = 1
    tail = label + b"\x00" + context_u + context_v + m.u32(bits)
    while len(out) * 8 < bits:
        out += hmac.new(key, m.u32(counter) + tail, hash_name).digest()
        counter += 1
    return out[: (bits + 7) // 8]


def kdfe(
    hash_name: str, z: bytes, label: bytes, party_u: bytes, party_v: bytes, bits: int
) -> bytes:
    """KDFe (Part 1, 11.4.10.3): SP 800-56A concatenation KDF."""
    out = b""
    counter = 1
    while len(out) * 8 < bits:
        out += hashlib.new(
            hash_name, m.u32(counter) + z + label + b"\x00" + party_u + party_v
        ).digest()
        counter += 1
    return out[: (bits + 7) // 8]


def check_ek_template(ek: TpmPublic) -> None:
    """Require an EK usable for credential protection.

    Raises:
        EvidenceError: ``ek_template`` naming what is wrong.
    """
    if not ek.has_attributes(_EK_ATTRS):
        raise EvidenceError("ek_template", "EK must be a fixed, restricted decrypt key")
    if ek.symmetric[0] != ALG_AES or ek.symmetric[2] != ALG_CFB:
        raise EvidenceError("ek_template", "EK symmetric scheme must be AES-CFB")


@dataclasses.dataclass(frozen=True)
class CredentialChallenge:
    """What MakeCredential outputs, both with their TPM2B size prefixes."""

    credential_blob: bytes
    encrypted_secret: bytes


def _seed_rsa(ek: TpmPublic, hash_name: str) -> tuple[bytes, bytes]:
    key = ek.public_key()
    assert isinstance(key, rsa.RSAPublicKey)
    seed = os.urandom(hashlib.new(hash_name).digest_size)
    h = _HASH_CLASSES[hash_name]()
    pad = padding.OAEP(padding.MGF1(h), h, b"IDENTITY\x00")
    return seed, key.encrypt(seed, pad)


def _seed_ecc(ek: TpmPublic, hash_name: str) -> tuple[bytes, bytes]:
    key = ek.public_key()
    assert isinstance(key, ec.EllipticCurvePublicKey)
    ephemeral = ec.generate_private_key(key.curve)
    z = ephemeral.exchange(ec.ECDH(), key)
    size = (key.curve.key_size + 7) // 8
    nums = ephemeral.public_key().public_numbers()
    ex, ey = nums.x.to_bytes(size, "big"), nums.y.to_bytes(size, "big")
    bits = hashlib.new(hash_name).digest_size * 8
    seed = kdfe(hash_name, z, b"IDENTITY", ex, ek.unique[0], bits)
    return seed, m.tpm2b(ex) + m.tpm2b(ey)


def make_credential(
    ek: TpmPublic, name: bytes, credential: bytes
) -> CredentialChallenge:
    """Wrap ``credential`` so only the TPM holding ``ek`` and the object
    named ``name`` can recover it.

    Args:
        ek: the endorsement key (RSA or ECC, restricted decrypt, AES-CFB).
        name: the AK's TPM Name.
        credential: the secret, at most the EK nameAlg digest size.

    Raises:
        EvidenceError: if the EK cannot protect credentials.
    """
    check_ek_template(ek)
    hash_name = hash_for_alg(ek.name_alg)
    if not 0 < len(credential) <= hashlib.new(hash_name).digest_size:
        raise ValueError("credential must be 1..digest-size bytes")
    seed, secret = (_seed_rsa if ek.rsa_bits else _seed_ecc)(ek, hash_name)
    sym_key = kdfa(hash_name, seed, b"STORAGE", name, b"", ek.symmetric[1])
    encryptor = Cipher(algorithms.AES(sym_key), CFB(bytes(16))).encryptor()
    enc_identity = encryptor.update(m.tpm2b(credential)) + encryptor.finalize()
    digest_bits = hashlib.new(hash_name).digest_size * 8
    hmac_key = kdfa(hash_name, seed, b"INTEGRITY", b"", b"", digest_bits)
    outer = hmac.new(hmac_key, enc_identity + name, hash_name).digest()
    blob = m.tpm2b(m.tpm2b(outer) + enc_identity)
    return CredentialChallenge(blob, m.tpm2b(secret))
