"""The sequencer's loop in a verifier process: a pass at once when a
state change with a log entry was committed here (``wake``), and every
``interval`` seconds otherwise (entries staged by other processes, or by
changes that do not wake it), on a worker thread (the database off the
event loop). Retention prunes once an hour.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from verifier.attest.scheduler import wait_event
from verifier.tlog.sequencer import LogSequencer

__all__ = ["LogPump"]

LOG = logging.getLogger(__name__)
#: Seconds between retention passes.
PRUNE_EVERY = 3600.0


class LogPump:
    """Runs the sequencer (and retention) in the background.

    Args:
        sequencer: appends the staged entries.
        interval: seconds between passes without a wake-up.
        retention_days: entries older than this many days lose their
            bodies (0: kept for ever).
        clock: wall clock (seconds).
    """

    def __init__(
        self,
        sequencer: LogSequencer,
        interval: float,
        retention_days: float = 0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._sequencer = sequencer
        self._interval = interval
        self._retention = retention_days * 86400.0
        self._clock = clock
        self._wakeup = asyncio.Event()
        self._pruned_at = 0.0

    def wake(self) -> None:
        """An entry was committed: sequence it now."""
        self._wakeup.set()

    def pass_once(self) -> int:
        """One pass (in the calling thread): sequence, prune when due."""
        count = self._sequencer.sequence_all()
        now = self._clock()
        if self._retention and now - self._pruned_at >= PRUNE_EVERY:
            self._pruned_at = now
            self._sequencer.prune(now - self._retention)
        return count

    async def run(self) -> None:
        """Sequence until cancelled, whatever the database does."""
        while True:
            try:
                await asyncio.to_thread(self.pass_once)
            except Exception:  # keep going: the next pass retries
                LOG.exception("Attestation log sequencing pass failed")
            await wait_event(self._wakeup, self._interval)
            self._wakeup.clear()
