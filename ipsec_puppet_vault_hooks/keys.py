"""Loading the verifier's event-signing public key."""

from __future__ import annotations

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from ipsec_puppet_vault_hooks.exceptions import HooksError

__all__ = ["load_public_key"]


def load_public_key(path: str) -> ed25519.Ed25519PublicKey:
    """Load an Ed25519 public key from a PEM file.

    Args:
        path: the PEM file.

    Returns:
        The public key.

    Raises:
        HooksError: naming ``path`` if the file cannot be read, is not a
            PEM public key, or is not an Ed25519 key.
    """
    try:
        with open(path, "rb") as f:
            pem = f.read()
    except OSError as exc:
        raise HooksError(f"cannot read public key {path}: {exc}") from exc
    try:
        key = serialization.load_pem_public_key(pem)
    except (ValueError, TypeError) as exc:
        raise HooksError(f"{path} is not a PEM public key: {exc}") from exc
    if not isinstance(key, ed25519.Ed25519PublicKey):
        raise HooksError(
            f"{path} holds a {type(key).__name__}, not an Ed25519 public key"
        )
    return key
