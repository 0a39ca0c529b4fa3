"""When each node is quoted next: one heap of due times and a fixed pool of
quote workers (not a task per node: a sleeping node costs a heap entry)."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections.abc import Awaitable, Callable

from verifier.attest.node import LiveNode

LOG = logging.getLogger(__name__)
MAX_BACKOFF = 30.0


async def wait_event(event: asyncio.Event, timeout: float | None) -> None:
    """Wait for ``event`` at most ``timeout`` seconds (None: forever).

    (Not ``asyncio.wait_for``: on Python 3.11 a cancellation racing its
    timeout can leave the waiting task stuck in "cancelling".)"""
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        pass


def next_delay(node: LiveNode, interval: float) -> float:
    """The quote interval, backed off exponentially (up to 30 s) while a
    node does not answer, so that dead agents cost next to nothing."""
    if node.unreachable == 0:
        return interval
    backoff: float = min(MAX_BACKOFF, 0.25 * 2.0 ** min(node.unreachable - 1, 10))
    return max(interval, backoff)


class QuoteScheduler:
    """Runs ``attest(node)`` for each live node whenever it is due.

    Args:
        attest: one quote round for a node (exceptions are logged).
        is_live: whether a node is still to be attested by us.
        delay: seconds until the node's next round, after a round.
        workers: how many rounds may be in flight at once.
    """

    def __init__(
        self,
        attest: Callable[[LiveNode], Awaitable[object]],
        is_live: Callable[[LiveNode], bool],
        delay: Callable[[LiveNode], float],
        workers: int,
    ) -> None:
        self._attest = attest
        self._is_live = is_live
        self._delay = delay
        self._workers = workers
        self._due: list[tuple[float, int, LiveNode]] = []
        self._seq = itertools.count()
        self._ready: asyncio.Queue[LiveNode] = asyncio.Queue()
        self._changed = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def schedule(self, node: LiveNode, delay: float) -> None:
        """Quote ``node`` in ``delay`` seconds (a node that is no longer
        live when it comes due is skipped)."""
        due = asyncio.get_running_loop().time() + delay
        if not self._due or due < self._due[0][0]:
            self._changed.set()
        heapq.heappush(self._due, (due, next(self._seq), node))

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._dispatch())] + [
            asyncio.create_task(self._work()) for _ in range(self._workers)
        ]

    def stop(self) -> list[asyncio.Task[None]]:
        """Cancel the loops; returns the tasks for the caller to await."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        return tasks

    async def _dispatch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            while self._due and self._due[0][0] <= now:
                _, _, node = heapq.heappop(self._due)
                if self._is_live(node):
                    self._ready.put_nowait(node)
            self._changed.clear()
            timeout = self._due[0][0] - now if self._due else None
            await wait_event(self._changed, timeout)

    async def _work(self) -> None:
        while True:
            node = await self._ready.get()
            if not self._is_live(node):
                continue
            try:
                await self._attest(node)
            except asyncio.CancelledError:
                raise
            except Exception:  # keep attesting whatever happens
                LOG.exception("Unexpected error attesting node %s", node.uuid)
            if self._is_live(node):
                self.schedule(node, self._delay(node))
