"""Exceptions of the tenant tools."""

from __future__ import annotations


class TenantError(Exception):
    """Root of the tenant tools' errors; the message is meant for the user."""


class UsageError(TenantError):
    """A bad command line or input file (exit status 2); the message names
    the option or file and the position."""


class AttestationFailedError(TenantError):
    """The node's identity quote did not verify: nothing was sent to it."""


class ServiceError(TenantError):
    """The registrar, verifier or agent refused or could not be reached.

    Attributes:
        status: the HTTP status of a refusal; None if there was no answer.
        code: the service's error code of a refusal (e.g. ``already_enrolled``).
    """

    def __init__(
        self, message: str, status: int | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class AgentError(ServiceError):
    """A node's agent could not be reached (or presented another
    certificate than the registered one), or refused the request."""


class PackageError(UsageError):
    """A package, a repository's index or signature, or a package source
    that does not verify or cannot be read (exit status 2); the message
    names the file.

    Attributes:
        where: the file or URL at fault.
        reason: what is wrong with it.
    """

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}")
        self.where = where
        self.reason = reason
