"""PCR policies: for each PCR index, the set of digests a node may report.

Wire form (JSON): ``{"pcrs": {"16": ["<hex sha256>", ...]}, "hash": "sha256"}``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from verifier.protocol.errors import MalformedError
from verifier.protocol.tpm import ALG_SHA256, hash_for_alg

__all__ = ["PcrPolicy"]

_HASH_NAMES = {"sha256": ALG_SHA256}
_MAX_DIGESTS_PER_PCR = 256


def _parse_digest(text: object, index: int) -> bytes:
    if not isinstance(text, str):
        raise MalformedError("PCR policy", f"PCR {index}: digest must be a hex string")
    try:
        value = bytes.fromhex(text)
    except ValueError:
        raise MalformedError("PCR policy", f"PCR {index}: {text!r} is not hex")
    if len(value) != 32:
        raise MalformedError(
            "PCR policy", f"PCR {index}: digest is {len(value)} bytes, expected 32"
        )
    return value


@dataclasses.dataclass(frozen=True)
class PcrPolicy:
    """Allowed digests per PCR (sha256 bank).

    Attributes:
        allowed: PCR index -> frozenset of allowed 32-byte values.
    """

    allowed: Mapping[int, frozenset[bytes]]
    hash_alg: int = ALG_SHA256

    def __post_init__(self) -> None:
        hash_for_alg(self.hash_alg)
        for index, values in self.allowed.items():
            if not 0 <= index < 24:
                raise MalformedError("PCR policy", f"PCR index {index} out of range")
            if not values:
                raise MalformedError("PCR policy", f"PCR {index}: no allowed values")

    @property
    def pcrs(self) -> tuple[int, ...]:
        """The PCR indices the policy constrains, sorted."""
        return tuple(sorted(self.allowed))

    @classmethod
    def from_dict(cls, data: object, allow_empty: bool = False) -> PcrPolicy:
        """Parse the JSON form.

        Args:
            data: the JSON object.
            allow_empty: accept a policy that constrains no PCR (only when
                other evidence, such as an IMA runtime policy, is checked).

        Raises:
            MalformedError: naming the offending field.
        """
        if not isinstance(data, Mapping):
            raise MalformedError("PCR policy", "must be an object")
        hash_name = data.get("hash", "sha256")
        if not isinstance(hash_name, str) or hash_name not in _HASH_NAMES:
            raise MalformedError("PCR policy", f"unsupported hash {hash_name!r}")
        pcrs = data.get("pcrs")
        if not isinstance(pcrs, Mapping):
            raise MalformedError("PCR policy", "'pcrs' must be an object")
        if not pcrs and not allow_empty:
            raise MalformedError("PCR policy", "must constrain at least one PCR")
        allowed: dict[int, frozenset[bytes]] = {}
        for key, digests in pcrs.items():
            try:
                index = int(key)
            except (TypeError, ValueError):
                raise MalformedError("PCR policy", f"PCR index {key!r} is not a number")
            if isinstance(digests, str):
                digests = [digests]
            if not isinstance(digests, list) or len(digests) > _MAX_DIGESTS_PER_PCR:
                raise MalformedError(
                    "PCR policy", f"PCR {index}: expected a list of hex digests"
                )
            allowed[index] = frozenset(_parse_digest(d, index) for d in digests)
        return cls(allowed, _HASH_NAMES[hash_name])

    def to_dict(self) -> dict[str, Any]:
        return {
            "hash": "sha256",
            "pcrs": {
                str(i): sorted(v.hex() for v in self.allowed[i]) for i in self.pcrs
            },
        }

    def mismatches(self, values: Mapping[int, bytes]) -> list[int]:
        """PCR indices whose value is missing from ``values`` or not allowed."""
        return [i for i in self.pcrs if values.get(i) not in self.allowed[i]]
