"""Share U comes from the node's enroller (ARCHITECTURE "Flows" 3).

The tenant that enrols a node picks U, and with V it gives the verifier a
commitment to U: ``SHA-256(domain || uuid || U)``. The verifier releases
the commitment to the node together with V (after the node's first good
quote), and the node combines V only with the U that matches it. A U from
anyone else (another project's tenant, anyone who can reach the agent) is
never combined: it cannot replace the enroller's U, and the node cannot be
left in bootstrapping by a foreign U that makes the shares mismatch.

The enroller is the project the verifier let enrol the node (Keystone
scope, Nova ownership, ``already_enrolled``); no tenant certificate is
needed to prove it, and the agent can check it with no credential of its
own. The commitment reveals nothing of K: U is 256 uniform bits, hashed
under a domain separator with the node's UUID.

Before V arrives the agent cannot tell the enroller's U from another, so it
keeps a bounded set of candidates (:class:`UCandidates`); when V arrives,
it takes the one that matches and forgets the rest.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterator
from typing import Generic, TypeVar

from verifier.protocol.errors import EvidenceError

__all__ = [
    "COMMITMENT_BYTES",
    "MAX_CANDIDATES",
    "ShareNotFromEnrollerError",
    "TooManySharesError",
    "UCandidates",
    "check_u",
    "commit_u",
]

COMMITMENT_BYTES = 32
#: Distinct U a node keeps before V says which one is its enroller's.
MAX_CANDIDATES = 16
_DOMAIN = b"trusted-cloud share-U commitment v1\x00"
_T = TypeVar("_T")


class ShareNotFromEnrollerError(EvidenceError):
    """A U that does not match the enroller's commitment."""

    def __init__(self, uuid: str) -> None:
        super().__init__(
            "u_not_from_enroller",
            f"share U does not match the commitment of node {uuid}'s enroller",
        )


class TooManySharesError(EvidenceError):
    """More distinct U than :data:`MAX_CANDIDATES` before V arrived."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            "too_many_shares",
            f"{limit} different shares U are already waiting for V; retry "
            "once the verifier has released V",
        )


def commit_u(uuid: str, u: bytes) -> bytes:
    """The enroller's commitment to ``u`` for node ``uuid`` (canonical)."""
    return hashlib.sha256(_DOMAIN + uuid.encode("ascii") + b"\x00" + u).digest()


def check_u(commitment: bytes, uuid: str, u: bytes) -> None:
    """Check that ``u`` is the share the enroller of ``uuid`` committed to.

    Raises:
        ShareNotFromEnrollerError: it is not (or the commitment is not
            :data:`COMMITMENT_BYTES` long).
    """
    if len(commitment) != COMMITMENT_BYTES or not hmac.compare_digest(
        commitment, commit_u(uuid, u)
    ):
        raise ShareNotFromEnrollerError(uuid)


class UCandidates(Generic[_T]):
    """The shares U a node received before V, keyed by their commitment.

    The same U offered again replaces its earlier offer (a tenant's retry);
    a new U is refused once :data:`MAX_CANDIDATES` are waiting, so no
    stranger can push the enroller's U out.

    Args:
        uuid: the node (canonical form).
        limit: how many distinct U are kept.
    """

    def __init__(self, uuid: str, limit: int = MAX_CANDIDATES) -> None:
        self._uuid = uuid
        self._limit = limit
        self._items: dict[bytes, tuple[bytes, _T]] = {}

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._items)

    def offer(self, u: bytes, extra: _T) -> None:
        """Keep ``u`` (with ``extra``, e.g. its payload) until V comes.

        Raises:
            TooManySharesError: the set is full and ``u`` is new (nothing
                stored).
        """
        key = commit_u(self._uuid, u)
        if key not in self._items and len(self._items) >= self._limit:
            raise TooManySharesError(self._limit)
        self._items[key] = (u, extra)

    def take(self, commitment: bytes) -> tuple[bytes, _T] | None:
        """The U matching ``commitment`` and its extra, or None; every
        other candidate is forgotten either way."""
        found = self._items.get(commitment)
        self._items.clear()
        if found is not None:
            check_u(commitment, self._uuid, found[0])  # keyed by it: holds
        return found

    def clear(self) -> None:
        self._items.clear()
