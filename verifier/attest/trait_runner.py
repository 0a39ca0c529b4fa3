"""Runs the Placement trait sync of the compute hosts (trusted compute
pools, issue 29) beside the quote loop.

:class:`~verifier.placement.TraitSync` records desired traits cheaply
(:meth:`TraitRunner.want`, called on the event loop by the host verdicts)
and writes them with blocking HTTP (:meth:`~verifier.placement.TraitSync.
pump`): this runner pumps it on a worker thread after each change and
whenever a failed write is due again, so a change Placement refused or
could not take is retried until it lands, and every provider is read
again now and then so that a trait changed behind the verifier's back is
corrected.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from verifier.placement import PlacementError, TraitSync

__all__ = ["TraitRunner"]

LOG = logging.getLogger(__name__)


class TraitRunner:
    """Pumps a :class:`TraitSync`.

    Args:
        sync: the desired traits and their writes.
        clock: the sync's clock (monotonic seconds).
        resync_interval: seconds between reads of every provider's traits
            again (one GET each), correcting a trait someone else added or
            removed behind the verifier's back.
    """

    def __init__(
        self,
        sync: TraitSync,
        clock: Callable[[], float] = time.monotonic,
        resync_interval: float = 600.0,
    ) -> None:
        self.sync = sync
        self._clock = clock
        self._resync = resync_interval
        self._resynced = clock()
        self._wake = asyncio.Event()

    def want(self, provider: str, trusted: bool) -> None:
        """The host of ``provider`` should (not) carry the trait; written
        soon, on a worker thread."""
        try:
            self.sync.want(provider, trusted)
        except PlacementError as exc:  # not a UUID: never a host's provider
            LOG.error("Placement: %s", exc)
            return
        self._wake.set()

    async def run(self) -> None:
        """Pump after each change and when a retry is due, for ever."""
        while True:
            due = self.sync.next_due()
            resync = self._resynced + self._resync
            due = resync if due is None else min(due, resync)
            try:
                await asyncio.wait_for(self._wake.wait(), max(0.0, due - self._clock()))
            except TimeoutError:
                pass
            self._wake.clear()
            if self._clock() >= resync:  # correct what changed behind our back
                self.sync.resync()
                self._resynced = self._clock()
            await asyncio.to_thread(self.sync.pump)
