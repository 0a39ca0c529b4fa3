"""The outbox pump: signed events committed with their state change
(:mod:`verifier.attest.transitions`) leave the outbox here, at once when a
writer wakes the pump and every few passes otherwise (retries, events of
other processes' nodes that this process delivers).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from verifier.attest.scheduler import wait_event
from verifier.notify import Outbox

__all__ = ["OutboxPump"]

LOG = logging.getLogger(__name__)


class OutboxPump:
    """Delivers the outbox's due events.

    Args:
        outbox: the events and their notifiers.
        owns: whether this process delivers a node's events.
        interval: seconds between passes (a pass without a wake-up comes
            at most four intervals after the last).
    """

    def __init__(
        self, outbox: Outbox, owns: Callable[[str], bool], interval: float
    ) -> None:
        self._outbox = outbox
        self._owns = owns
        self._interval = interval
        self._wakeup = asyncio.Event()

    def wake(self) -> None:
        """An event was committed: deliver it now."""
        self._wakeup.set()

    async def run(self) -> None:
        """Deliver until cancelled, whatever a notifier does."""
        while True:
            await wait_event(self._wakeup, self._interval * 4)
            self._wakeup.clear()
            try:
                await asyncio.to_thread(self._outbox.dispatch_once, 100, self._owns)
            except Exception:  # keep delivering whatever a driver does
                LOG.exception("Outbox delivery pass failed")
            await asyncio.sleep(self._interval)
