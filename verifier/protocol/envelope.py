"""Authenticated envelopes.

* Payload envelope: AES-256-GCM under the tenant's key K; the associated
  data binds the node UUID, so a payload sealed for one node does not open
  on another. Wire form: ``b"TCP1" || nonce(12) || ciphertext || tag``.
* Share envelope: a key share (U or V) sealed to a node's ephemeral X25519
  share-transport key (NK), which the node commits to inside a quote
  (ECIES: X25519, HKDF-SHA256, AES-256-GCM). Wire form:
  ``b"TCS1" || ephemeral public(32) || nonce(12) || ciphertext || tag``.

Opening never returns partial plaintext: either the tag verifies or
:class:`EnvelopeError` is raised.
"""

from __future__ import annotations

import enum
import os
import uuid as uuid_mod

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import x25519
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from verifier.protocol.errors import EnvelopeError, MalformedError

__all__ = [
    "MAX_PAYLOAD_BYTES",
    "ShareKind",
    "canonical_uuid",
    "is_share_envelope",
    "open_payload",
    "open_share",
    "seal_payload",
    "seal_share",
]

MAX_PAYLOAD_BYTES = 16 * 1024 * 1024
_PAYLOAD_MAGIC = b"TCP1"
_SHARE_MAGIC = b"TCS1"
_RAW = serialization.Encoding.Raw, serialization.PublicFormat.Raw


class ShareKind(enum.StrEnum):
    """What a share envelope carries; bound into its key derivation, so an
    envelope of one kind never opens as another."""

    #: the tenant's share U (relayed, or sent by the tenant itself)
    U = "U"
    #: the verifier's share V, released after a good quote
    V = "V"
    #: a CP-ABE decryption key (:mod:`verifier.protocol.abe`)
    ABE = "ABE"


def canonical_uuid(node_uuid: str) -> str:
    """The canonical lower-case form of a node UUID.

    Raises:
        MalformedError: if ``node_uuid`` is not a UUID.
    """
    try:
        return str(uuid_mod.UUID(str(node_uuid)))
    except ValueError:
        raise MalformedError("node UUID", f"{node_uuid!r} is not a UUID")


def _payload_ad(node_uuid: str) -> bytes:
    return b"trusted-cloud payload v1\x00" + canonical_uuid(node_uuid).encode()


def seal_payload(key: bytes, plaintext: bytes, node_uuid: str) -> bytes:
    """Encrypt a tenant payload for one node under K."""
    if len(plaintext) > MAX_PAYLOAD_BYTES:
        raise MalformedError("payload", f"{len(plaintext)} bytes > {MAX_PAYLOAD_BYTES}")
    nonce = os.urandom(12)
    sealed = AESGCM(key).encrypt(nonce, plaintext, _payload_ad(node_uuid))
    return _PAYLOAD_MAGIC + nonce + sealed


def open_payload(key: bytes, envelope: bytes, node_uuid: str) -> bytes:
    """Decrypt a payload envelope.

    Raises:
        EnvelopeError: wrong key, other node's envelope, or tampering.
    """
    if envelope[:4] != _PAYLOAD_MAGIC or len(envelope) < 4 + 12 + 16:
        raise EnvelopeError("not a payload envelope")
    try:
        return AESGCM(key).decrypt(
            envelope[4:16], envelope[16:], _payload_ad(node_uuid)
        )
    except InvalidTag:
        raise EnvelopeError(
            "payload does not authenticate (wrong key, other node, or tampered)"
        )


def _share_key(shared: bytes, eph: bytes, nk: bytes, info: bytes) -> bytes:
    hkdf = HKDF(hashes.SHA256(), 32, salt=eph + nk, info=info)
    return hkdf.derive(shared)


def _share_info(kind: ShareKind, node_uuid: str) -> bytes:
    try:
        kind = ShareKind(kind)  # callers outside mypy's reach pass strings
    except ValueError:
        raise ValueError("share kind must be 'U', 'V' or 'ABE' (a CP-ABE key)")
    return f"trusted-cloud share v1\x00{kind}\x00{canonical_uuid(node_uuid)}".encode()


def seal_share(
    nk_public: bytes, share: bytes, kind: ShareKind, node_uuid: str
) -> bytes:
    """Seal share ``kind`` to the node's X25519 key ``nk_public``.

    Raises:
        MalformedError: if ``nk_public`` is not a 32-byte X25519 key.
    """
    try:
        peer = x25519.X25519PublicKey.from_public_bytes(nk_public)
    except ValueError:
        raise MalformedError("share transport key", "not a raw X25519 public key")
    eph = x25519.X25519PrivateKey.generate()
    eph_pub = eph.public_key().public_bytes(*_RAW)
    info = _share_info(kind, node_uuid)
    key = _share_key(eph.exchange(peer), eph_pub, nk_public, info)
    nonce = os.urandom(12)
    return _SHARE_MAGIC + eph_pub + nonce + AESGCM(key).encrypt(nonce, share, info)


def is_share_envelope(envelope: bytes) -> bool:
    """Whether ``envelope`` has the form of a share envelope (it can only
    be opened, and so authenticated, with the node's NK private key)."""
    return envelope[:4] == _SHARE_MAGIC and len(envelope) >= 4 + 32 + 12 + 16


def open_share(
    nk_private: x25519.X25519PrivateKey,
    envelope: bytes,
    kind: ShareKind,
    node_uuid: str,
) -> bytes:
    """Open a share envelope with the node's NK private key.

    Raises:
        EnvelopeError: if it does not authenticate for this node and kind.
    """
    if envelope[:4] != _SHARE_MAGIC or len(envelope) < 4 + 32 + 12 + 16:
        raise EnvelopeError("not a share envelope")
    eph_pub, nonce, sealed = envelope[4:36], envelope[36:48], envelope[48:]
    nk_pub = nk_private.public_key().public_bytes(*_RAW)
    info = _share_info(kind, node_uuid)
    try:
        shared = nk_private.exchange(x25519.X25519PublicKey.from_public_bytes(eph_pub))
        key = _share_key(shared, eph_pub, nk_pub, info)
        return AESGCM(key).decrypt(nonce, sealed, info)
    except (InvalidTag, ValueError):
        raise EnvelopeError(f"share {kind} does not authenticate for this node")
