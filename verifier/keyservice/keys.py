"""Loading the key service's and the verifier's capability key material."""

from __future__ import annotations

import os

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from verifier.exceptions import ConfigError
from verifier.protocol.capability import CAPABILITY_KEY_BYTES

__all__ = ["load_mac_key", "load_public_key"]


def load_mac_key(path: str, create: bool = True) -> bytes:
    """The 32-byte capability MAC key in ``path`` (created 0600 if missing).

    Raises:
        ConfigError: if the file is unreadable or not 32 bytes.
    """
    if create and not os.path.exists(path):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass  # another process created it meanwhile
        else:
            with os.fdopen(fd, "wb") as f:
                f.write(os.urandom(CAPABILITY_KEY_BYTES))
    try:
        with open(path, "rb") as f:
            key = f.read()
    except OSError as exc:
        raise ConfigError(f"capability key {path}: {exc}")
    if len(key) != CAPABILITY_KEY_BYTES:
        raise ConfigError(
            f"capability key {path} must hold {CAPABILITY_KEY_BYTES} bytes"
        )
    return key


def load_public_key(path: str) -> ed25519.Ed25519PublicKey:
    """An Ed25519 public key (PEM).

    Raises:
        ConfigError: naming the file and the problem.
    """
    try:
        with open(path, "rb") as f:
            key = serialization.load_pem_public_key(f.read())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"public key {path}: {exc}")
    if not isinstance(key, ed25519.Ed25519PublicKey):
        raise ConfigError(f"public key {path} is not Ed25519")
    return key
