"""Exceptions of the tenant tools."""

from __future__ import annotations


class TenantError(Exception):
    """Root of the tenant tools' errors; the message is meant for the user."""


class AttestationFailedError(TenantError):
    """The node's identity quote did not verify: nothing was sent to it."""


class ServiceError(TenantError):
    """The registrar, verifier or agent refused or could not be reached."""
