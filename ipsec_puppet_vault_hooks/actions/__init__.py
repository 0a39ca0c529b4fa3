"""Revocation actions: what to do when a node is revoked.

Drivers are loaded by stevedore from the ``ipsec_puppet_vault_hooks.actions``
entry-point group; ``noop`` and ``log`` ship with the package.
"""

from ipsec_puppet_vault_hooks.actions.base import Action

__all__ = ["Action"]
