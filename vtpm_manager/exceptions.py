"""Errors of the vTPM manager: one root, sub-roots by who is at fault."""

from __future__ import annotations

__all__ = [
    "DomainNotFoundError",
    "EkConflictError",
    "LibvirtError",
    "RegistrarUnavailableError",
    "RegistrationRefusedError",
    "SwtpmSetupError",
    "UnsupportedTpmError",
    "VtpmError",
]


class VtpmError(Exception):
    """Root of the vTPM manager's errors."""


class DomainNotFoundError(VtpmError):
    """libvirt knows no domain by that name or UUID."""

    def __init__(self, domain: str) -> None:
        super().__init__(f"no libvirt domain named or with UUID {domain!r}")
        self.domain = domain


class UnsupportedTpmError(VtpmError):
    """The domain has a TPM device we must not replace (TPM 1.2, passthrough)."""


class LibvirtError(VtpmError):
    """libvirt refused an operation (define, lookup, undefine)."""


class SwtpmSetupError(VtpmError):
    """swtpm_setup (or swtpm reading the new state back) failed."""


class RegistrarUnavailableError(VtpmError):
    """The registrar could not be reached, even after retries."""


class RegistrationRefusedError(VtpmError):
    """The registrar answered with a refusal (4xx).

    Attributes:
        status: the HTTP status.
        code: the registrar's error code.
    """

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"registrar refused ({status} {code}): {message}")
        self.status = status
        self.code = code


class EkConflictError(RegistrationRefusedError):
    """The instance UUID is already registered with another EK: an attack or
    a bug, never overwritten."""


class HostCaError(VtpmError):
    """The compute host's swtpm local CA cannot be read or is no CA."""
