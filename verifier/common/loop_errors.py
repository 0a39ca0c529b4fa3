"""The event loop's exception handler of the services: a connection that
failed in the transport is one log line, not a traceback.

Under overload the verifier gives up on rounds whose agents answer late
and closes their connections; when an answer arrives on a connection
being torn down, uvloop's TLS layer trips over its own closed socket
handle and reports "Fatal error on SSL protocol" (a ``RuntimeError`` from
``UVHandle._ensure_alive``) to the loop's exception handler, whose default
logs it at ERROR with a full traceback: about 800 a minute in the
10,000-node soak of issue 19. The exchange itself has already failed as
a :class:`~verifier.common.errors.TransportError` (the node counts as
unreachable), so the traceback says nothing new and buries the log.

:class:`TransportFailureLog` takes such reports only: an ``OSError``
(reset, refused, a TLS alert: ``ssl.SSLError`` is one) reported with a
transport or protocol, or any exception reported with one whose every
frame is the event loop's own transport code (uvloop's compiled
``uvloop/*.pyx``, asyncio's ``sslproto``, ``selector_events``). Each is
logged at DEBUG as one line with the running count, and at most one
WARNING per ``interval`` sums them up. Everything else -- an exception
raised by a protocol (ours, aiohttp's: a real bug), a task's exception
never retrieved, a callback that failed -- goes to the handler that was
installed before (by default the loop's own, with its traceback).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

__all__ = ["TransportFailureLog", "guarded", "install", "is_transport_failure"]

LOG = logging.getLogger(__name__)

_ExceptionHandler = Callable[[asyncio.AbstractEventLoop, dict[str, Any]], object]
_T = TypeVar("_T")

_ASYNCIO_DIR = os.path.dirname(asyncio.__file__)
#: The event loop's own transport code: uvloop's Cython sources name their
#: frames ``uvloop/...pyx``; asyncio's are these modules.
_LOOP_FILES = tuple(
    os.path.join(_ASYNCIO_DIR, name)
    for name in ("sslproto.py", "selector_events.py", "transports.py")
)


def _loop_frame(filename: str) -> bool:
    return filename.startswith("uvloop/") or filename in _LOOP_FILES


def _raised_by_the_loop(exc: BaseException) -> bool:
    """Every frame of the exception's traceback is transport code of the
    event loop (no protocol or application code ran)."""
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb is not None:
        if not _loop_frame(tb.tb_frame.f_code.co_filename):
            return False
        tb = tb.tb_next
    return True


def is_transport_failure(context: Mapping[str, Any]) -> bool:
    """Whether an exception-handler ``context`` reports a connection that
    failed in the transport (see the module docstring)."""
    exc = context.get("exception")
    if exc is None:
        return False
    if context.get("transport") is None and context.get("protocol") is None:
        return False
    return isinstance(exc, OSError) or _raised_by_the_loop(exc)


class TransportFailureLog:
    """An event loop exception handler (see the module docstring).

    Args:
        previous: the handler that gets every other report (None: the
            loop's default handler).
        interval: seconds between WARNING summaries.
        clock: monotonic seconds.

    Attributes:
        count: transport failures seen.
    """

    def __init__(
        self,
        previous: _ExceptionHandler | None = None,
        interval: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._previous = previous
        self._interval = interval
        self._clock = clock
        self._summed = 0
        self._next_summary = float("-inf")
        self.count = 0

    def __call__(
        self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]
    ) -> None:
        if not is_transport_failure(context):
            if self._previous is not None:
                self._previous(loop, context)
            else:
                loop.default_exception_handler(context)
            return
        self.count += 1
        exc = context["exception"]
        message = context.get("message") or "transport error"
        LOG.debug(
            "Connection failed in the transport (%d so far): %s: %s",
            self.count,
            message,
            f"{type(exc).__name__}: {exc}"[:300],
        )
        now = self._clock()
        if now >= self._next_summary:
            # (called while the loop handles the exception: oslo.log adds
            # its one-line summary to a WARNING by itself)
            LOG.warning(
                "%d connection(s) failed in the transport since the last "
                "report (a peer dropped or reset it mid-exchange, or an "
                "exchange was given up; each is counted where it failed); "
                "last: %s (%s)",
                self.count - self._summed,
                message,
                type(exc).__name__,
            )
            self._summed = self.count
            self._next_summary = now + self._interval


def install(loop: asyncio.AbstractEventLoop | None = None) -> TransportFailureLog:
    """Put a :class:`TransportFailureLog` on ``loop`` (default: the running
    one) in front of its current handler; returns it."""
    loop = loop or asyncio.get_running_loop()
    handler = TransportFailureLog(loop.get_exception_handler())
    loop.set_exception_handler(handler)
    return handler


async def guarded(main: Awaitable[_T]) -> _T:
    """Await ``main`` with a :class:`TransportFailureLog` on the running
    loop: what each service's entry point runs (``uvloop.run(guarded(...))``)."""
    install()
    return await main
