"""Base class of revocation actions."""

from __future__ import annotations

import abc

from oslo_config import cfg

from ipsec_puppet_vault_hooks.exceptions import ActionError
from verifier.protocol import RevocationEvent

__all__ = ["Action"]


class Action(abc.ABC):
    """Something done when a node is revoked (close its tunnels, revoke its
    certificates, log it, ...).

    Actions **must be idempotent**: an event may be delivered more than once
    (the consumer deduplicates, but its state can be lost, and a failed
    action is retried), so handling the same event twice must have the same
    effect as handling it once.

    Subclasses set :attr:`name` (their entry-point name) and implement
    :meth:`_handle`.

    Attributes:
        name: the action's entry-point name, used in errors and dead letters.
        conf: the configuration the action was built with.
    """

    name: str

    def __init__(self, conf: cfg.ConfigOpts) -> None:
        self.conf = conf

    def handle(self, event: RevocationEvent) -> None:
        """Carry out the action for a verified revocation event.

        Args:
            event: the verified event.

        Raises:
            ActionError: on any failure.
        """
        try:
            self._handle(event)
        except ActionError:
            raise
        except Exception as exc:
            raise ActionError(
                self.name, event.id, f"{type(exc).__name__}: {exc}"
            ) from exc

    @abc.abstractmethod
    def _handle(self, event: RevocationEvent) -> None:
        """Do the work of :meth:`handle`; may raise anything."""
