"""Companion vTPMs for libvirt domains, registered with the registrar under
the Nova instance UUID before the guest boots (see doc/source/admin/vtpm.rst).
"""

from vtpm_manager.exceptions import (
    DomainNotFoundError,
    EkConflictError,
    LibvirtError,
    RegistrarUnavailableError,
    RegistrationRefusedError,
    SwtpmSetupError,
    UnsupportedTpmError,
    VtpmError,
)
from vtpm_manager.manager import EnsureResult, ManagerConfig, VtpmManager
from vtpm_manager.registrar_client import ProviderRegistrarClient

__all__ = [
    "DomainNotFoundError",
    "EkConflictError",
    "EnsureResult",
    "LibvirtError",
    "ManagerConfig",
    "ProviderRegistrarClient",
    "RegistrarUnavailableError",
    "RegistrationRefusedError",
    "SwtpmSetupError",
    "UnsupportedTpmError",
    "VtpmError",
    "VtpmManager",
]
