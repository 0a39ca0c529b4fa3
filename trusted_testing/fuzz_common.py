"""What the fuzz targets share: the :class:`Target` shape, running one
(only the project's errors are expected), JSON in and out, and a node with
a good quote answer (built once per process)."""

from __future__ import annotations

import base64
import dataclasses
import functools
import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import x25519

from verifier.protocol import errors, jsonlimits

__all__ = ["NODE", "RAW", "Target", "dump_json", "load_json", "node", "run_one"]

NODE = "3f2a6c1e-5b1d-4c1e-9a7e-0c6d2b8e4f10"
RAW = serialization.Encoding.Raw, serialization.PublicFormat.Raw


@dataclasses.dataclass(frozen=True)
class Target:
    """One fuzz target.

    Attributes:
        name: its name on the command line.
        run: the entry point, given the fuzzer's bytes.
        seeds: valid (or nearly valid) inputs to start from.
        max_len: the input size it needs at least (0: the command line's).
    """

    name: str
    run: Callable[[bytes], object]
    seeds: Callable[[], Sequence[bytes]]
    max_len: int = 0


def run_one(target: Target, data: bytes) -> None:
    """Run ``target`` on ``data``; the project's errors are expected.

    Raises:
        Exception: anything but a :class:`ProtocolError` (a finding).
    """
    try:
        target.run(data)
    except errors.ProtocolError:
        pass


def load_json(data: bytes) -> Any:
    return jsonlimits.loads(data)


def dump_json(value: object) -> bytes:
    return json.dumps(value).encode()


# -- fixtures shared by the targets (built once per process) ----------------


@functools.lru_cache(maxsize=1)
def node() -> Any:
    """A SoftTpm with its AK, an NK and a good quote answer to one request."""
    from trusted_testing.softtpm import SoftTpm
    from verifier.protocol import bind_nonce

    tpm = SoftTpm(ak_alg="ecc", ek_alg="ecc")
    tpm.extend(16, hashlib.sha256(b"boot").digest())
    nk = x25519.X25519PrivateKey.generate()
    nk_public = nk.public_key().public_bytes(*RAW)
    nonce = bytes(range(20))
    quote = tpm.quote(bind_nonce(nonce, nk_public), (16,))
    answer = {"quote": quote.to_dict(), "nk": base64.b64encode(nk_public).decode()}
    return tpm, nk, nk_public, nonce, answer
