"""Give freed heap memory back to the system now and then (glibc only).

Every new mutual-TLS connection to an agent allocates tens of KB in
OpenSSL and uvloop outside Python's allocator; when connections are
replaced (a timed-out round, or a node whose interval is longer than the
keep-alive), glibc keeps the freed chunks scattered in its heap and the
resident size grows without levelling off although nothing is leaked:
the issue 19 soak saw +20 MiB/min. ``malloc_trim(0)`` returns those free
pages; it costs milliseconds and is run once a minute.

glibc also gives every thread that allocates its own heap (an *arena*,
up to eight per core): the verifier's database work runs on a pool of
worker threads, each of which read thousands of rows into its own arena
and freed them, so that several arenas each held tens of MiB of free
memory between two trims (the issue 34 soak: the resident size swung by
±25 MiB a minute at 5,000 nodes over a flat Python heap).
:func:`limit_arenas` caps them at :data:`ARENAS` (the process's start
calls it, before it starts any thread): the workers share, and reuse,
the same free memory.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import os
from collections.abc import Callable

LOG = logging.getLogger(__name__)
INTERVAL = 60.0
#: glibc malloc arenas of a verifier process (the main one and one shared
#: by the worker threads).
ARENAS = 2
_M_ARENA_MAX = -8  # glibc's malloc.h

__all__ = ["ARENAS", "INTERVAL", "limit_arenas", "malloc_trim", "trim_loop"]


def _load(symbol: str, *argtypes: type) -> Callable[..., int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        fn = getattr(ctypes.CDLL(name), symbol)
    except (OSError, AttributeError):  # not glibc (musl, macOS)
        return None
    fn.argtypes = list(argtypes)
    fn.restype = ctypes.c_int
    return fn  # type: ignore[no-any-return]


_TRIM = _load("malloc_trim", ctypes.c_size_t)
_MALLOPT = _load("mallopt", ctypes.c_int, ctypes.c_int)


def limit_arenas(count: int = ARENAS) -> bool | None:
    """Let glibc make at most ``count`` malloc arenas from now on (threads
    beyond share them): True if set, None where the C library has no
    ``mallopt``. An operator's ``MALLOC_ARENA_MAX`` wins over it."""
    if _MALLOPT is None or _TRIM is None:  # mallopt alone: not surely glibc
        return None
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False
    return bool(_MALLOPT(_M_ARENA_MAX, count))


def malloc_trim() -> bool | None:
    """Return free heap pages to the system: True if some were, None where
    the C library has no ``malloc_trim``."""
    if _TRIM is None:
        return None
    return bool(_TRIM(0))


async def trim_loop(interval: float = INTERVAL) -> None:
    """Trim every ``interval`` seconds, for ever (a no-op without glibc)."""
    if _TRIM is None:
        LOG.debug("No malloc_trim in this C library: heap not trimmed")
        return
    while True:
        await asyncio.sleep(interval)
        malloc_trim()
