"""An opt-in memory diagnostic of a running verifier (issue 34, item 7):
where its resident size goes, sampled every few seconds to a file.

Off unless the environment names a file (an operator's or a benchmark's
switch, never a configuration option: it costs CPU and, with tracing,
memory)::

    TRUSTED_MEMDIAG_FILE=/tmp/verifier-mem.jsonl   # on: one JSON line a sample
    TRUSTED_MEMDIAG_INTERVAL=60                    # seconds between samples
    TRUSTED_MEMDIAG_TRACE=0                        # tracemalloc frames (0: off)
    TRUSTED_MEMDIAG_TOP=25                         # rows of each table

Each line tells the Python heap from the C heap: the resident size
(``rss_kib``), Python's live objects (``blocks``: ``sys.getallocatedblocks``;
``gc_objects`` and the object types that grew most since the first
sample), glibc's heap (``mallinfo2``: ``used`` is allocated, ``free`` is
free but not returned, ``mmap`` is large blocks in their own mappings) and,
with tracing on, the memory Python traced and the source lines whose
allocations grew most since the first sample. A resident size that grows
while ``blocks`` and ``traced`` stay flat is memory outside Python's
allocator (OpenSSL, SQLite, the event loop's C buffers); ``free`` growing
with ``used`` flat is fragmentation.
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import ctypes.util
import gc
import json
import logging
import os
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Mapping
from typing import Any

LOG = logging.getLogger(__name__)

__all__ = ["MemorySampler", "configured", "from_environment"]


class _Mallinfo2(ctypes.Structure):
    _fields_ = [  # noqa: RUF012 (ctypes' own declaration)
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _load_mallinfo2() -> Any:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        fn = ctypes.CDLL(name).mallinfo2
    except (OSError, AttributeError):  # not glibc >= 2.33
        return None
    fn.argtypes = []
    fn.restype = _Mallinfo2
    return fn


_MALLINFO2 = _load_mallinfo2()


def malloc_arenas() -> int | None:
    """How many malloc arenas glibc has made (``malloc_info``'s heaps;
    None without it)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        info, fopen, fclose = libc.malloc_info, libc.fopen, libc.fclose
    except (OSError, AttributeError):
        return None
    fopen.restype = ctypes.c_void_p
    fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    fclose.argtypes = [ctypes.c_void_p]
    with tempfile.NamedTemporaryFile(suffix=".xml") as tmp:
        stream = fopen(tmp.name.encode(), b"w")
        if not stream:
            return None
        try:
            info(0, stream)
        finally:
            fclose(stream)
        return tmp.read().count(b"<heap nr=")


def mallinfo() -> dict[str, int] | None:
    """glibc's heap, all arenas, in KiB (None without ``mallinfo2``)."""
    if _MALLINFO2 is None:
        return None
    info = _MALLINFO2()
    return {
        "arena": info.arena // 1024,
        "used": info.uordblks // 1024,
        "free": info.fordblks // 1024,
        "mmap": info.hblkhd // 1024,
        "top": info.keepcost // 1024,
    }


def _rss_kib() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def smaps() -> dict[str, int]:
    """Resident KiB by kind of mapping: ``heap`` (the main C heap),
    ``anon`` (anonymous mappings: Python's object arenas, threads' C
    heaps, large blocks), ``file`` (code and data of files)."""
    out = {"heap": 0, "anon": 0, "file": 0}
    kind = "anon"
    try:
        with open("/proc/self/smaps", encoding="ascii", errors="replace") as f:
            for line in f:
                head = line.split(None, 6)
                if head[0] == "Rss:":
                    out[kind] += int(head[1])
                elif len(head) >= 5 and "-" in head[0] and not head[0].endswith(":"):
                    name = head[5].strip() if len(head) > 5 else ""
                    if name == "[heap]":
                        kind = "heap"
                    elif name.startswith("/"):
                        kind = "file"
                    else:
                        kind = "anon"
    except OSError:
        pass
    return out


def pymalloc() -> dict[str, int]:
    """Python's small-object allocator (``sys._debugmallocstats``, which
    writes to the C ``stderr``: captured through a temporary file): its
    arenas now and ever, and KiB in used and in free blocks of them."""
    keys = {
        "# arenas allocated current": "arenas",
        "# arenas allocated total": "arenas_total",
        "# arenas highwater mark": "arenas_highwater",
        "# bytes in allocated blocks": "used_kib",
        "# bytes in available blocks": "free_kib",
    }
    out: dict[str, int] = {}
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with tempfile.TemporaryFile() as tmp:
            os.dup2(tmp.fileno(), 2)
            try:
                sys._debugmallocstats()
            finally:
                os.dup2(saved, 2)
            tmp.seek(0)
            text = tmp.read().decode("ascii", "replace")
    finally:
        os.close(saved)
    for line in text.splitlines():
        name, _, value = line.partition("=")
        key = keys.get(name.strip())
        if key is not None:
            number = int(value.strip().replace(",", ""))
            out[key] = number // 1024 if key.endswith("_kib") else number
    return out


def _type_counts() -> collections.Counter[str]:
    return collections.Counter(type(o).__qualname__ for o in gc.get_objects())


class MemorySampler:
    """Writes one sample of the process's memory per :meth:`sample` call.

    Args:
        path: the file the JSON lines are appended to.
        top: rows of each growth table.
        trace: tracemalloc frames to keep (0: no tracing).
        clock: seconds (monotonic), for the samples' ``t``.
    """

    def __init__(
        self, path: str, top: int = 25, trace: int = 0, clock: Any = time.monotonic
    ) -> None:
        self.path = path
        self.top = top
        self.trace = trace
        self._clock = clock
        self._t0 = clock()
        self._types: collections.Counter[str] | None = None
        self._snapshot: tracemalloc.Snapshot | None = None
        if trace and not tracemalloc.is_tracing():
            tracemalloc.start(trace)

    def sample(self) -> dict[str, Any]:
        """Take one sample, append it to the file and return it."""
        types = _type_counts()
        if self._types is None:
            self._types = types
        grown = collections.Counter(types)
        grown.subtract(self._types)
        row: dict[str, Any] = {
            "t": round(self._clock() - self._t0, 1),
            "rss_kib": _rss_kib(),
            "blocks": sys.getallocatedblocks(),
            "gc_objects": sum(types.values()),
            "mallinfo": mallinfo(),
            "arenas": malloc_arenas(),
            "smaps": smaps(),
            "pymalloc": pymalloc(),
            "types_grown": [
                [name, types[name], n] for name, n in grown.most_common(self.top)
            ],
        }
        if tracemalloc.is_tracing():
            row.update(self._traced())
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        return row

    def _traced(self) -> dict[str, Any]:
        current, peak = tracemalloc.get_traced_memory()
        snapshot = tracemalloc.take_snapshot().filter_traces(
            (tracemalloc.Filter(False, tracemalloc.__file__),)
        )
        if self._snapshot is None:
            self._snapshot = snapshot
        stats = snapshot.compare_to(self._snapshot, "lineno")[: self.top]
        return {
            "traced_kib": current // 1024,
            "traced_peak_kib": peak // 1024,
            "traced_grown": [
                [str(s.traceback[0]), s.size // 1024, s.size_diff // 1024, s.count]
                for s in stats
            ],
        }

    async def run(self, interval: float) -> None:
        """Sample every ``interval`` seconds, for ever."""
        LOG.warning(
            "Memory diagnostic on: a sample every %g s to %s", interval, self.path
        )
        while True:
            self.sample()
            await asyncio.sleep(interval)


def from_environment(
    environ: Mapping[str, str] = os.environ,
) -> tuple[MemorySampler, float] | None:
    """The sampler and its interval the environment asks for (None: off).

    Raises:
        ValueError: a number that is not one.
    """
    path = environ.get("TRUSTED_MEMDIAG_FILE", "")
    if not path:
        return None
    interval = float(environ.get("TRUSTED_MEMDIAG_INTERVAL", "60"))
    trace = int(environ.get("TRUSTED_MEMDIAG_TRACE", "0"))
    top = int(environ.get("TRUSTED_MEMDIAG_TOP", "25"))
    if interval <= 0 or trace < 0 or top <= 0:
        raise ValueError("TRUSTED_MEMDIAG_INTERVAL, _TRACE and _TOP must be positive")
    return MemorySampler(path, top, trace), interval


def configured(
    environ: Mapping[str, str] = os.environ,
) -> tuple[MemorySampler, float] | None:
    """:func:`from_environment` for the service: a bad number is logged
    and leaves the diagnostic off (it never stops the verifier)."""
    try:
        return from_environment(environ)
    except ValueError as exc:
        LOG.error("Memory diagnostic off: %s", exc)
        return None
