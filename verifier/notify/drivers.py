"""The noop notifier driver (the in-process one is the revocation hooks'
:mod:`ipsec_puppet_vault_hooks.inprocess`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from verifier.common.plugins import Notifier

__all__ = ["NoopNotifier"]


class NoopNotifier(Notifier):
    """Acknowledges every event and does nothing."""

    name = "noop"

    def _deliver(self, event: Mapping[str, Any]) -> bool:
        return True
