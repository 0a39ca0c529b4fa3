"""Signed runtime policies: a detached signature over a policy's
canonical JSON (:meth:`RuntimePolicy.canonical_json`), so a verifier can
accept only the policies an operator or tenant key signed.
"""

from __future__ import annotations

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from verifier.protocol.errors import EvidenceError
from verifier.protocol.ima.policy import RuntimePolicy

__all__ = ["SigningKey", "VerifyingKey", "sign", "verify"]

#: The keys a runtime policy is signed and verified with.
SigningKey = ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey
VerifyingKey = ed25519.Ed25519PublicKey | ec.EllipticCurvePublicKey


def sign(policy: RuntimePolicy, key: SigningKey) -> bytes:
    """A detached signature over :meth:`RuntimePolicy.canonical_json`.

    Ed25519, or ECDSA with SHA-256 (DER signature).
    """
    data = policy.canonical_json()
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return key.sign(data)
    return key.sign(data, ec.ECDSA(hashes.SHA256()))


def verify(policy: RuntimePolicy, signature: bytes, public_key: VerifyingKey) -> None:
    """Check a detached signature made by :func:`sign`.

    Raises:
        EvidenceError: ``ima_policy_signature`` if it does not verify.
    """
    data = policy.canonical_json()
    try:
        if isinstance(public_key, ed25519.Ed25519PublicKey):
            public_key.verify(signature, data)
        else:
            public_key.verify(signature, data, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        raise EvidenceError(
            "ima_policy_signature",
            f"signature over policy {policy.name!r} v{policy.version} is not valid",
        ) from None
