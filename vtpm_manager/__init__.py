"""Companion vTPMs for libvirt domains, registered with the registrar under
the Nova instance UUID before the guest boots (see doc/source/admin/vtpm.rst).

The manager (:class:`VtpmManager`, :class:`ManagerConfig`,
:class:`EnsureResult`) needs libvirt (the ``vtpm`` extra) and is imported
on first use: the Nova listener's ``vtpm`` instance hook, which runs next to
the verifier, imports this package without libvirt.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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
from vtpm_manager.registrar_client import ProviderRegistrarClient

if TYPE_CHECKING:
    from vtpm_manager.manager import EnsureResult, ManagerConfig, VtpmManager

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

_MANAGER_NAMES = frozenset({"EnsureResult", "ManagerConfig", "VtpmManager"})


def __getattr__(name: str) -> Any:
    if name in _MANAGER_NAMES:
        from vtpm_manager import manager

        return getattr(manager, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
