"""When each node is quoted next: one heap of deadlines and a fixed pool of
quote workers (not a task per node: a sleeping node costs a heap entry).

Verification classes. Each node has its own quote interval (the
verifier's ``quote_interval`` unless the tenant chose another at
enrolment); the nodes sharing an interval form a class. Each node carries
a *virtual deadline*: its next round is due at its previous deadline plus
its interval (``max(previous + interval, frontier)``, the frontier being
the latest deadline handed to a worker). A worker always takes the node
with the earliest deadline that has come, and the dispatcher hands nodes
out only when a worker is free, so the heap (not a first-in first-out
queue) decides the order.

Without overload every node is quoted when due. Under overload the
frontier falls behind the wall clock, and since a node's deadline moves
on by its own interval per round, every class is slowed by the same
factor: demand ``D = sum(1/interval)`` quotes/s on a capacity of ``C``
gives each node ``C/D`` of its nominal rate, so a class watched every
second stays ten times as often checked as one watched every ten
seconds. (Scheduling each node ``interval`` after its round ended, in
the order nodes became due, would instead make every node wait the same
time ``L`` and give periods ``interval + L``, flattening the classes.)
:class:`Deadlines` is that order, pure and driven by the clock it is
given; :class:`ClassLag` accounts, per class, how late rounds started.
A deadline is never set more than :data:`MAX_LAG` behind the clock, so the
classes keep their proportions while the verifier is less than that
behind, and the catch-up after a long overload is bounded.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import heapq
import itertools
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Generic, TypeVar

from verifier.attest.node import LiveNode

LOG = logging.getLogger(__name__)
MAX_BACKOFF = 30.0
#: A deadline is never set further behind the clock than this (seconds):
#: the backlog a long overload leaves, caught up once it is over.
MAX_LAG = 300.0

_T = TypeVar("_T")


async def wait_event(event: asyncio.Event, timeout: float | None) -> None:
    """Wait for ``event`` at most ``timeout`` seconds (None: forever).

    (Not ``asyncio.wait_for``: on Python 3.11 a cancellation racing its
    timeout can leave the waiting task stuck in "cancelling".)"""
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        pass


def background_task(coro: Coroutine[Any, Any, _T]) -> asyncio.Task[_T]:
    """A long-lived task of the service in a context of its own (an empty
    one), not a copy of its creator's: started while a request is served,
    it would otherwise carry that request's id and caller
    (:mod:`verifier.common.conventions`) onto every line it logs."""
    loop = asyncio.get_running_loop()
    return loop.create_task(coro, context=contextvars.Context())


def next_delay(node: LiveNode, interval: float) -> float:
    """The quote interval, backed off exponentially (up to 30 s) while a
    node does not answer, so that dead agents cost next to nothing."""
    if node.unreachable == 0:
        return interval
    backoff: float = min(MAX_BACKOFF, 0.25 * 2.0 ** min(node.unreachable - 1, 10))
    return max(interval, backoff)


class Deadlines(Generic[_T]):
    """Virtual deadlines of items, earliest first (see the module
    docstring). Pure: every call is given the time ``now``."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, _T]] = []
        self._seq = itertools.count()
        self.frontier = float("-inf")  # the latest deadline handed out

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, item: _T, deadline: float) -> bool:
        """Put ``item`` in at ``deadline``; True if it is now the earliest."""
        first = not self._heap or deadline < self._heap[0][0]
        heapq.heappush(self._heap, (deadline, next(self._seq), item))
        return first

    def start(self, item: _T, now: float, delay: float) -> bool:
        """``item`` is due ``delay`` seconds from ``now`` (a new node: at
        once, but behind nodes already overdue)."""
        if delay > 0:
            return self.add(item, now + delay)
        started = self.frontier != float("-inf")
        return self.add(item, min(now, self.frontier) if started else now)

    def again(self, item: _T, previous: float, delay: float, now: float) -> bool:
        """``item``'s next deadline after the round due at ``previous``
        (never more than :data:`MAX_LAG` behind ``now``)."""
        return self.add(item, max(previous + delay, self.frontier, now - MAX_LAG))

    def pop_due(self, now: float) -> tuple[float, _T] | None:
        """The earliest (deadline, item) whose deadline has come, or None."""
        if not self._heap or self._heap[0][0] > now:
            return None
        deadline, _, item = heapq.heappop(self._heap)
        if deadline > self.frontier:
            self.frontier = deadline
        return deadline, item

    def wait(self, now: float) -> float | None:
        """Seconds until the earliest deadline (None: nothing scheduled)."""
        return max(0.0, self._heap[0][0] - now) if self._heap else None

    def overdue(self, now: float) -> float:
        """Seconds the earliest deadline is past ``now`` (0: none is)."""
        return max(0.0, now - self._heap[0][0]) if self._heap else 0.0


@dataclasses.dataclass
class ClassLag:
    """How late the rounds of one verification class started.

    Attributes:
        interval: the class's quote interval (seconds).
        rounds: rounds started.
        lag_sum: their total lateness (seconds).
        lag_max: the largest lateness seen.
    """

    interval: float
    rounds: int = 0
    lag_sum: float = 0.0
    lag_max: float = 0.0

    def add(self, lag: float) -> None:
        self.rounds += 1
        self.lag_sum += lag
        if lag > self.lag_max:
            self.lag_max = lag

    def to_dict(self) -> dict[str, float]:
        mean = self.lag_sum / self.rounds if self.rounds else 0.0
        return {
            "interval": self.interval,
            "rounds": self.rounds,
            "lag_mean": round(mean, 6),
            "lag_max": round(self.lag_max, 6),
        }


_MAX_CLASSES = 1000  # distinct intervals accounted (beyond: one bucket)


class QuoteScheduler:
    """Runs ``attest(node)`` for each live node whenever it is due.

    Args:
        attest: one quote round for a node (exceptions are logged).
        is_live: whether a node is still to be attested by us.
        interval: a node's quote interval (its class).
        workers: how many rounds may be in flight at once.
        rest: told after each round how many seconds until the node's
            next one (the connection policy, :meth:`VerifierAgentClient.rest`).
    """

    def __init__(
        self,
        attest: Callable[[LiveNode], Awaitable[object]],
        is_live: Callable[[LiveNode], bool],
        interval: Callable[[LiveNode], float],
        workers: int,
        rest: Callable[[LiveNode, float], None] | None = None,
    ) -> None:
        self._attest = attest
        self._rest = rest
        self._is_live = is_live
        self._interval = interval
        self._workers = workers
        self._deadlines: Deadlines[LiveNode] = Deadlines()
        self._ready: asyncio.Queue[tuple[float, LiveNode]] = asyncio.Queue()
        self._free = asyncio.Semaphore(workers)
        self._changed = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._lag: dict[float, ClassLag] = {}

    def schedule(self, node: LiveNode, delay: float) -> None:
        """Quote ``node`` in ``delay`` seconds (a node that is no longer
        live when it comes due is skipped)."""
        now = asyncio.get_running_loop().time()
        if self._deadlines.start(node, now, delay):
            self._changed.set()

    def classes(self) -> list[dict[str, float]]:
        """Per verification class: rounds started and their lateness."""
        return [self._lag[k].to_dict() for k in sorted(self._lag)]

    def lag(self) -> float:
        """Seconds the most overdue round has been waiting to start (0 when
        none is late, or the scheduler is stopped)."""
        if not self._tasks:
            return 0.0
        return self._deadlines.overdue(asyncio.get_running_loop().time())

    def start(self) -> None:
        self._ready = asyncio.Queue()
        self._free = asyncio.Semaphore(self._workers)
        self._tasks = [background_task(self._dispatch())] + [
            background_task(self._work()) for _ in range(self._workers)
        ]

    def stop(self) -> list[asyncio.Task[None]]:
        """Cancel the loops; returns the tasks for the caller to await."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        return tasks

    def _account(self, node: LiveNode, lag: float) -> None:
        interval = self._interval(node)
        entry = self._lag.get(interval)
        if entry is None:
            if len(self._lag) >= _MAX_CLASSES:
                interval = -1.0  # "other intervals"
            entry = self._lag.setdefault(interval, ClassLag(interval))
        entry.add(lag)

    async def _next_due(self) -> tuple[float, LiveNode]:
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            while (due := self._deadlines.pop_due(now)) is not None:
                if self._is_live(due[1]):
                    self._account(due[1], now - due[0])
                    return due
            self._changed.clear()
            await wait_event(self._changed, self._deadlines.wait(now))

    async def _dispatch(self) -> None:
        # nodes leave the heap only for a free worker: the heap decides
        while True:
            await self._free.acquire()
            self._ready.put_nowait(await self._next_due())

    async def _work(self) -> None:
        while True:
            deadline, node = await self._ready.get()
            try:
                if self._is_live(node):
                    await self._attest(node)
            except asyncio.CancelledError:
                raise
            except Exception:  # keep attesting whatever happens
                LOG.exception("Unexpected error attesting node %s", node.uuid)
            finally:
                self._free.release()
            if self._is_live(node):
                delay = next_delay(node, self._interval(node))
                if self._rest is not None:
                    try:
                        self._rest(node, delay)
                    except Exception:  # the node must still be rescheduled
                        LOG.exception("Connection policy failed for node %s", node.uuid)
                now = asyncio.get_running_loop().time()
                if self._deadlines.again(node, deadline, delay, now):
                    self._changed.set()
