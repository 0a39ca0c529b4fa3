"""The shares a node agent holds while it waits for the other one, and
which U it takes: only the enroller's (:mod:`verifier.protocol.enroller`).
"""

from __future__ import annotations

from dataclasses import dataclass

from node_agent.exceptions import RefusedError
from verifier.protocol import EvidenceError
from verifier.protocol.enroller import (
    TooManySharesError,
    UCandidates,
    check_u,
    commit_u,
)

__all__ = ["Share", "check_enroller", "offer", "select_u"]


@dataclass
class Share:
    """A share received and opened, with what came along with it."""

    value: bytes
    payload: bytes | None = None  # with U: the payload envelope
    payload_id: str | None = None  # with U: the envelope's binding, if not us
    identity_cert: bytes | None = None  # with V: the node's identity cert
    commitment: bytes | None = None  # with V: the enroller's commitment to U


def offer(candidates: UCandidates[Share], u: bytes, share: Share) -> None:
    """Keep ``u`` until V says whose it must be.

    Raises:
        RefusedError: ``too_many_shares`` (429, nothing stored).
    """
    try:
        candidates.offer(u, share)
    except TooManySharesError as exc:
        raise RefusedError(exc.reason, exc.detail, 429)


def check_enroller(v: Share, uuid: str, u: bytes, certified: bool) -> None:
    """Check that ``u`` (arriving after ``v``) is the enroller's.

    Raises:
        RefusedError: ``u_not_from_enroller`` (403).
    """
    try:
        if v.commitment is not None:
            check_u(v.commitment, uuid, u)
        elif not certified:
            raise EvidenceError(
                "u_not_from_enroller",
                "this enrolment has no commitment to U: U is taken only "
                "from a tenant certificate",
            )
    except EvidenceError as exc:
        raise RefusedError(exc.reason, exc.detail, 403)


def select_u(
    uuid: str,
    commitment: bytes | None,
    current: Share | None,
    certified: Share | None,
    candidates: UCandidates[Share],
) -> Share | None:
    """The enroller's U once V (with ``commitment``) has come: ``current``
    if it matches, else the matching candidate; for a V without a
    commitment, ``current`` or the last U from a tenant certificate. The
    other candidates are forgotten."""
    if commitment is None:
        candidates.clear()
        return current or certified
    if current is not None and commit_u(uuid, current.value) == commitment:
        candidates.clear()
        return current
    found = candidates.take(commitment)
    return None if found is None else found[1]
