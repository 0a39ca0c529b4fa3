"""Per-project quotas: nodes, pending enrolments, policies, policy bytes.

A quota is checked in the transaction that adds the resource, under a
process-wide lock, so one verifier process never goes past a limit; with
several verifier processes on one database, concurrent additions may pass
a limit by at most one per process (the flat model of Keystone's unified
limits: usage is counted, not reserved).
"""

from __future__ import annotations

import dataclasses
import threading

from verifier.exceptions import RequestError

__all__ = ["UNLIMITED", "QuotaExceededError", "Quotas"]

UNLIMITED = -1


class QuotaExceededError(RequestError):
    """A project is at its limit of a resource (HTTP 403, as Nova answers)."""

    status = 403

    def __init__(self, resource: str, limit: int) -> None:
        super().__init__(
            "quota_exceeded", f"the project is at its quota of {limit} {resource}"
        )
        self.resource = resource
        self.limit = limit


@dataclasses.dataclass(frozen=True)
class Quotas:
    """The limits every project gets (:data:`UNLIMITED`: none).

    Attributes:
        nodes: enrolled nodes.
        pending_enrolments: nodes enrolled ahead of their instance.
        policies: stored policies.
        policy_bytes: total bytes of stored policies.
    """

    nodes: int = UNLIMITED
    pending_enrolments: int = UNLIMITED
    policies: int = UNLIMITED
    policy_bytes: int = UNLIMITED
    lock: threading.Lock = dataclasses.field(
        default_factory=threading.Lock, compare=False, repr=False
    )

    def check(self, resource: str, used: int, adding: int = 1) -> None:
        """Refuse to take ``used`` of ``resource`` past its limit.

        Raises:
            QuotaExceededError: ``used + adding`` exceeds the limit.
        """
        limit = int(getattr(self, resource))
        if limit != UNLIMITED and used + adding > limit:
            raise QuotaExceededError(resource.replace("_", " "), limit)
