"""The ``noop`` action: does nothing."""

from __future__ import annotations

from ipsec_puppet_vault_hooks.actions.base import Action
from verifier.protocol import RevocationEvent

__all__ = ["NoopAction"]


class NoopAction(Action):
    """Does nothing (trivially idempotent)."""

    name = "noop"

    def _handle(self, event: RevocationEvent) -> None:
        pass
