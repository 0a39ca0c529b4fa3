"""Exceptions of the registrar and verifier services (not the protocol core,
which has its own root in :mod:`verifier.protocol.errors`)."""

from __future__ import annotations

__all__ = [
    "AgentUnreachableError",
    "ConfigError",
    "ConflictError",
    "NotFoundError",
    "RequestError",
    "VerifierError",
]


class VerifierError(Exception):
    """Root of the service-side errors."""


class ConfigError(VerifierError):
    """The service is misconfigured (missing certificate, bad option)."""


class RequestError(VerifierError):
    """A client sent a request we refuse (maps to HTTP 4xx).

    Attributes:
        status: the HTTP status to answer with.
        code: a stable machine-readable error code.
        detail: a human-readable message naming the problem.
    """

    status = 400

    def __init__(self, code: str, detail: str, status: int | None = None) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail
        if status is not None:
            self.status = status


class NotFoundError(RequestError):
    status = 404


class ConflictError(RequestError):
    status = 409


class AgentUnreachableError(VerifierError):
    """A node agent did not answer (transport failure, not bad evidence)."""
