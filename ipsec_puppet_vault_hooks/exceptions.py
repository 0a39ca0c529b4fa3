"""Exceptions of :mod:`ipsec_puppet_vault_hooks`.

One root, :class:`HooksError`; every failure that leaves this package is
one of its subclasses. Exceptions carry fields and never log.
"""

from __future__ import annotations

__all__ = ["ActionError", "EventRejectedError", "HooksError"]


class HooksError(Exception):
    """Root of every error raised by :mod:`ipsec_puppet_vault_hooks`."""


class ActionError(HooksError):
    """A revocation action failed to handle an event.

    Attributes:
        action: name of the action that failed.
        event_id: id of the event being handled.
        detail: what went wrong.
    """

    def __init__(self, action: str, event_id: str, detail: str) -> None:
        super().__init__(f"action {action!r} failed on event {event_id}: {detail}")
        self.action = action
        self.event_id = event_id
        self.detail = detail


class EventRejectedError(HooksError):
    """An incoming event is malformed or its signature does not verify.

    A rejected event is never acknowledged and runs no action.

    Attributes:
        reason: stable, machine-readable code (``malformed`` or
            ``event_signature``).
        detail: human-readable explanation.
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"event rejected ({reason}): {detail}")
        self.reason = reason
        self.detail = detail
