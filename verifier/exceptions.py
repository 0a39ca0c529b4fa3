"""Exceptions of the registrar and verifier services (not the protocol core,
which has its own root in :mod:`verifier.protocol.errors`). Refusals of a
request are the shared :class:`verifier.common.errors.RequestError` family,
and an unreachable agent the shared
:class:`verifier.common.errors.AgentUnreachableError` (the tenant tools use
the same agent client), re-exported here."""

from __future__ import annotations

from verifier.common.errors import (
    AgentUnreachableError,
    ConflictError,
    NotFoundError,
    RequestError,
)

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
