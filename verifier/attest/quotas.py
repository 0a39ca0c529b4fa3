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
from collections.abc import Callable

from verifier.exceptions import RequestError, VerifierError

__all__ = ["UNLIMITED", "QuotaExceededError", "Quotas"]

UNLIMITED = -1


class QuotaExceededError(RequestError, VerifierError):
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
        source: (project, resource) -> that project's limit, or None for
            the default above (e.g.
            :class:`~verifier.attest.keystone_limits.KeystoneLimits`);
            None: the defaults for every project.
    """

    nodes: int = UNLIMITED
    pending_enrolments: int = UNLIMITED
    policies: int = UNLIMITED
    policy_bytes: int = UNLIMITED
    source: Callable[[str, str], int | None] | None = dataclasses.field(
        default=None, compare=False
    )
    lock: threading.Lock = dataclasses.field(
        default_factory=threading.Lock, compare=False, repr=False
    )

    def limit(self, resource: str, project: str = "") -> int:
        """``project``'s limit of ``resource``.

        Raises:
            RequestError: the source could not be asked (fail closed).
        """
        found = None
        if self.source is not None and project:
            found = self.source(project, resource)
        return int(getattr(self, resource)) if found is None else found

    def check(
        self, resource: str, used: int, adding: int = 1, project: str = ""
    ) -> None:
        """Refuse to take ``used`` of ``resource`` past ``project``'s limit.

        Raises:
            QuotaExceededError: ``used + adding`` exceeds the limit.
            RequestError: the limit could not be read (fail closed).
        """
        limit = self.limit(resource, project)
        if limit != UNLIMITED and used + adding > limit:
            raise QuotaExceededError(resource.replace("_", " "), limit)
