"""Give freed heap memory back to the system now and then (glibc only).

Every new mutual-TLS connection to an agent allocates tens of KB in
OpenSSL and uvloop outside Python's allocator; when connections are
replaced (a timed-out round, or a node whose interval is longer than the
keep-alive), glibc keeps the freed chunks scattered in its heap and the
resident size grows without levelling off although nothing is leaked:
the issue 19 soak saw +20 MiB/min. ``malloc_trim(0)`` returns those free
pages; it costs milliseconds and is run once a minute.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
from collections.abc import Callable

LOG = logging.getLogger(__name__)
INTERVAL = 60.0

__all__ = ["INTERVAL", "malloc_trim", "trim_loop"]


def _load() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        fn = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS)
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


_TRIM = _load()


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
