"""Entry point for ``oslo-config-generator``."""

from __future__ import annotations

from oslo_config import cfg

from ipsec_puppet_vault_hooks.conf import _MODULES

__all__ = ["list_opts"]


def list_opts() -> list[tuple[cfg.OptGroup, list[cfg.Opt]]]:
    """Return ``[(group, opts)]`` for every option group of this package."""
    return [
        (group, list(opts))
        for module in _MODULES
        for group, opts in module.list_opts().items()
    ]
