"""Key shares: the tenant's 256-bit payload key K = U xor V.

The tenant keeps K, sends V to the verifier and U to the node; neither
share alone says anything about K (a one-time pad of K).
"""

from __future__ import annotations

import os

__all__ = ["KEY_BYTES", "combine", "generate_key", "split"]

KEY_BYTES = 32


def generate_key() -> bytes:
    """A fresh 256-bit key."""
    return os.urandom(KEY_BYTES)


def split(key: bytes) -> tuple[bytes, bytes]:
    """Split ``key`` into (U, V) with U uniformly random and V = K xor U."""
    if len(key) != KEY_BYTES:
        raise ValueError(f"key must be {KEY_BYTES} bytes")
    u = os.urandom(KEY_BYTES)
    return u, combine(key, u)


def combine(u: bytes, v: bytes) -> bytes:
    """Recombine two shares into K."""
    if len(u) != KEY_BYTES or len(v) != KEY_BYTES:
        raise ValueError(f"shares must be {KEY_BYTES} bytes each")
    return bytes(a ^ b for a, b in zip(u, v, strict=True))
