"""The outbox pump: signed events committed with their state change
(:mod:`verifier.attest.transitions`) leave the outbox here, at once when a
writer wakes the pump and every few passes otherwise (retries, events of
other processes' nodes that this process delivers). With a retention
(``[verifier] event_retention_days``) it deletes the delivered events past
it once an hour.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from verifier.attest.scheduler import wait_event
from verifier.notify import Outbox

__all__ = ["OutboxPump"]

LOG = logging.getLogger(__name__)
#: Seconds between event retention passes.
PRUNE_EVERY = 3600.0


class OutboxPump:
    """Delivers the outbox's due events.

    Args:
        outbox: the events and their notifiers.
        owns: whether this process delivers a node's events.
        interval: seconds between passes (a pass without a wake-up comes
            at most four intervals after the last).
        retention_days: delivered events older than this many days are
            deleted (0: kept for ever).
        clock: wall clock (seconds).
    """

    def __init__(
        self,
        outbox: Outbox,
        owns: Callable[[str], bool],
        interval: float,
        retention_days: float = 0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._outbox = outbox
        self._owns = owns
        self._interval = interval
        self._retention = retention_days * 86400.0
        self._clock = clock
        self._pruned_at = float("-inf")
        self._wakeup = asyncio.Event()

    def wake(self) -> None:
        """An event was committed: deliver it now."""
        self._wakeup.set()

    def prune_if_due(self) -> int:
        """Delete the delivered events past the retention, at most once per
        :data:`PRUNE_EVERY` seconds (in the calling thread). Returns how
        many were deleted."""
        now = self._clock()
        if not self._retention or now - self._pruned_at < PRUNE_EVERY:
            return 0
        self._pruned_at = now
        deleted = self._outbox.prune(now - self._retention)
        if deleted:
            LOG.info("Event retention: deleted %d delivered events", deleted)
        return deleted

    async def run(self) -> None:
        """Deliver until cancelled, whatever a notifier does."""
        while True:
            await wait_event(self._wakeup, self._interval * 4)
            self._wakeup.clear()
            try:
                await asyncio.to_thread(self._outbox.dispatch_once, 100, self._owns)
            except Exception:  # keep delivering whatever a driver does
                LOG.exception("Outbox delivery pass failed")
            try:
                await asyncio.to_thread(self.prune_if_due)
            except Exception:  # the next pass retries
                LOG.exception("Event retention pass failed")
            await asyncio.sleep(self._interval)
