"""The dashboard's errors: one root, split by who is at fault.

The API client (:mod:`attestation_dashboard.api.attestation`) turns every
failure of a call into one of these; the views map them to what Horizon
shows (a one-line message, its not-found page, its not-authorized page, a
form error).
"""

from __future__ import annotations

__all__ = [
    "AttestationRefusedError",
    "DashboardError",
    "AttestationForbiddenError",
    "AttestationNotFoundError",
    "AttestationUnreachableError",
]


class DashboardError(Exception):
    """The root of the dashboard's errors."""


class AttestationUnreachableError(DashboardError):
    """The attestation API cannot be reached: no endpoint in the catalog,
    connection refused, a timeout, TLS failure, or an answer that is not
    the API's (a 5xx, or not JSON).

    Attributes:
        reason: a short reason, for one line of the page.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class AttestationRefusedError(DashboardError):
    """The API answered a 4xx with its JSON error body.

    Attributes:
        status: the HTTP status.
        code: the error's stable code (``bad_policy``, ``forbidden``...).
        message: the API's message.
    """

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{message} ({code})")
        self.status = status
        self.code = code
        self.message = message


class AttestationNotFoundError(AttestationRefusedError):
    """404: no such node, policy or host for this caller (another
    project's is not found either)."""


class AttestationForbiddenError(AttestationRefusedError):
    """401/403: the caller may not do this."""
