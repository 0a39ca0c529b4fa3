"""Configuration options of :mod:`ipsec_puppet_vault_hooks`.

One module per option group; :func:`register_opts` registers them all.
"""

from __future__ import annotations

from oslo_config import cfg

from ipsec_puppet_vault_hooks.conf import (
    action_ipsec,
    action_log,
    action_puppet,
    action_vault,
    listener,
    puppet_autosign,
    revocation_hooks,
)

__all__ = ["register_opts"]

_MODULES = (
    revocation_hooks,
    action_log,
    listener,
    action_vault,
    action_ipsec,
    action_puppet,
    puppet_autosign,
)


def register_opts(conf: cfg.ConfigOpts) -> None:
    """Register every option group of this package on ``conf``."""
    for module in _MODULES:
        module.register_opts(conf)
