"""The wire records of the batched deep quote (:mod:`verifier.protocol.hostbatch`):
a guest's :class:`BatchProof` and a judged :class:`HostRound`, with the
checks of their fields. Private: import them from
:mod:`verifier.protocol.hostbatch`."""

from __future__ import annotations

import base64
import binascii
import dataclasses
import math
import uuid as uuid_mod
from collections.abc import Mapping
from typing import Any

from verifier.protocol.errors import MalformedError
from verifier.protocol.tpm import TpmAttest
from verifier.protocol.translog.tree import EMPTY_ROOT, HASH_SIZE, MAX_SIZE

__all__ = [
    "MAX_BOUND",
    "MAX_NONCE",
    "MIN_NONCE",
    "BatchProof",
    "HostRound",
    "check_hash",
    "check_nonce",
    "is_count",
    "is_time",
    "uuid_of",
]

#: Bounds of the verifier's fresh nonce in a host round.
MIN_NONCE, MAX_NONCE = 16, 64
#: At most this many items bound after the nonce (the agent's NK, a CSR).
MAX_BOUND = 4
#: Longest inclusion proof of a tree of at most MAX_SIZE leaves.
_MAX_PATH = 64
#: Largest TPMS_ATTEST accepted (as :class:`verifier.protocol.quote.Quote`).
_MAX_ATTEST = 4096
#: Largest item bound after the nonce (a CSR in DER).
_MAX_ITEM = 8192


def uuid_of(value: object, what: str) -> uuid_mod.UUID:
    if not isinstance(value, str):
        raise MalformedError(what, "must be a UUID string")
    try:
        return uuid_mod.UUID(value)
    except ValueError:
        raise MalformedError(what, f"not a UUID: {value[:40]!r}") from None


def is_count(value: object) -> bool:
    return type(value) is int and 0 <= value <= MAX_SIZE


def check_hash(value: object, what: str) -> bytes:
    if not isinstance(value, bytes) or len(value) != HASH_SIZE:
        raise MalformedError(what, "must be 32 bytes")
    return value


def check_nonce(value: object) -> bytes:
    if not isinstance(value, bytes) or not MIN_NONCE <= len(value) <= MAX_NONCE:
        raise MalformedError(
            "host nonce", f"fresh nonce must be {MIN_NONCE}..{MAX_NONCE} bytes"
        )
    return value


@dataclasses.dataclass(frozen=True)
class BatchProof:
    """A guest's inclusion proof in its host's batch (RFC 9162 2.1.3).

    Attributes:
        index: the guest's leaf index.
        size: the number of leaves in the batch.
        path: ``PATH(index, D[size])``, leaf side first.
    """

    index: int
    size: int
    path: tuple[bytes, ...]

    def __post_init__(self) -> None:
        if not is_count(self.size) or not is_count(self.index):
            raise MalformedError("batch proof", f"index and size must be 0..{MAX_SIZE}")
        if self.index >= self.size:
            raise MalformedError("batch proof", f"leaf {self.index} not in {self.size}")
        if not isinstance(self.path, tuple) or len(self.path) > _MAX_PATH:
            raise MalformedError(
                "batch proof", f"path must be a tuple of <= {_MAX_PATH}"
            )
        for item in self.path:
            check_hash(item, "batch proof path")

    def to_dict(self) -> dict[str, Any]:
        """``{"index": i, "size": n, "path": [hex, ...]}``."""
        return {
            "index": self.index,
            "size": self.size,
            "path": [h.hex() for h in self.path],
        }

    @classmethod
    def from_dict(cls, data: object) -> BatchProof:
        """Parse :meth:`to_dict`'s form; unknown fields are refused.

        Raises:
            MalformedError: wrong fields, types or lengths.
        """
        if not isinstance(data, Mapping) or set(data) != {"index", "size", "path"}:
            raise MalformedError("batch proof", "fields must be index, size, path")
        texts = data["path"]
        if not isinstance(texts, list) or len(texts) > _MAX_PATH:
            raise MalformedError(
                "batch proof", f"path must be a list of <= {_MAX_PATH}"
            )
        return cls(data["index"], data["size"], tuple(_hex(t, "path") for t in texts))


def _hex(value: object, what: str) -> bytes:
    if not isinstance(value, str) or len(value) != 2 * HASH_SIZE:
        raise MalformedError("batch", f"{what}: 64 hex digits expected")
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise MalformedError("batch", f"{what}: 64 hex digits expected") from None


@dataclasses.dataclass(frozen=True)
class HostRound:
    """A judged host round: what a guest's :class:`BatchProof` is checked
    against. The verifier's own record of the host quote it judged.

    Attributes:
        host_uuid: the host's node UUID (its resource provider UUID).
        fresh_nonce: the verifier's fresh nonce for the round.
        root: the batch's root.
        size: the batch's number of leaves.
        attest: the host quote's TPMS_ATTEST bytes.
        at: when the verifier judged it (its clock, in seconds).
        host_attested: the host's verdict in that round.
        bound: what the host agent bound after the nonce in the quote's
            qualifying data, as the verifier judged it (``bind_nonce(nonce,
            *bound)``): the agent's NK public key in pull mode (and its CSR
            if asked), the session label in push mode; empty for a quote of
            ``bind_nonce(nonce)`` alone.

    Raises:
        MalformedError: a field of the wrong type or size; an attest that
            is not a TPMS_ATTEST of a quote.
    """

    host_uuid: str
    fresh_nonce: bytes
    root: bytes
    size: int
    attest: bytes
    at: float
    host_attested: bool
    bound: tuple[bytes, ...] = ()

    def __post_init__(self) -> None:
        uuid_of(self.host_uuid, "host round host_uuid")
        check_nonce(self.fresh_nonce)
        check_hash(self.root, "host round root")
        if not is_count(self.size):
            raise MalformedError("host round", f"size must be 0..{MAX_SIZE}")
        if self.size == 0 and self.root != EMPTY_ROOT:
            raise MalformedError("host round", "an empty batch has the empty root")
        if not isinstance(self.attest, bytes) or len(self.attest) > _MAX_ATTEST:
            raise MalformedError("host round", f"attest must be <= {_MAX_ATTEST} bytes")
        TpmAttest.from_bytes(self.attest)
        if not is_time(self.at):
            raise MalformedError("host round", "at must be a finite number")
        if type(self.host_attested) is not bool:
            raise MalformedError("host round", "host_attested must be a boolean")
        if (
            not isinstance(self.bound, tuple)
            or len(self.bound) > MAX_BOUND
            or not all(isinstance(b, bytes) and len(b) <= _MAX_ITEM for b in self.bound)
        ):
            raise MalformedError(
                "host round",
                f"bound must be <= {MAX_BOUND} items of <= {_MAX_ITEM} bytes",
            )

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (bytes as hex, the attest as base64)."""
        return {
            "host_uuid": self.host_uuid,
            "fresh_nonce": self.fresh_nonce.hex(),
            "root": self.root.hex(),
            "size": self.size,
            "attest": base64.b64encode(self.attest).decode(),
            "at": self.at,
            "host_attested": self.host_attested,
            "bound": [base64.b64encode(b).decode() for b in self.bound],
        }

    @classmethod
    def from_dict(cls, data: object) -> HostRound:
        """Parse :meth:`to_dict`'s form (``bound`` may be absent: empty);
        unknown fields are refused.

        Raises:
            MalformedError: naming the bad field.
        """
        if not isinstance(data, Mapping) or not (
            _ROUND_FIELDS <= set(data) <= _ROUND_FIELDS | {"bound"}
        ):
            raise MalformedError(
                "host round", f"fields must be {sorted(_ROUND_FIELDS)} and bound"
            )
        bound = data.get("bound", [])
        if not isinstance(bound, list) or len(bound) > MAX_BOUND:
            raise MalformedError(
                "host round", f"bound must be a list of <= {MAX_BOUND}"
            )
        nonce = data["fresh_nonce"]
        if not isinstance(nonce, str) or len(nonce) > 2 * MAX_NONCE:
            raise MalformedError("host round", "fresh_nonce must be hex")
        try:
            fresh = bytes.fromhex(nonce)
        except ValueError:
            raise MalformedError("host round", "fresh_nonce must be hex") from None
        return cls(
            host_uuid=data["host_uuid"],
            fresh_nonce=fresh,
            root=_hex(data["root"], "root"),
            size=data["size"],
            attest=_b64(data["attest"], "attest", _MAX_ATTEST),
            at=data["at"],
            host_attested=data["host_attested"],
            bound=tuple(_b64(b, "bound", _MAX_ITEM) for b in bound),
        )


_ROUND_FIELDS = frozenset(
    {"host_uuid", "fresh_nonce", "root", "size", "attest", "at", "host_attested"}
)


def is_time(value: object) -> bool:
    return type(value) in (int, float) and math.isfinite(value)  # type: ignore[arg-type]


def _b64(value: object, what: str, limit: int) -> bytes:
    if not isinstance(value, str) or len(value) > 2 * limit:
        raise MalformedError("host round", f"{what} must be base64")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise MalformedError("host round", f"{what} must be base64") from None
