"""An opt-in CPU profile of a service's event loop, for benchmarks.

Off unless the environment names a directory::

    TRUSTED_CPU_PROFILE_DIR=/tmp/prof trusted-verifier --config-file ...

Then the service's main thread (its event loop: the HTTP servers, the
quote loop, the protocol core's checks) runs under :mod:`cProfile` and,
when the service stops, its statistics are written to
``DIR/PROG-PID.pstats`` (read them with :mod:`pstats` or
``tools/bench/storm.py --profile``). Work the services hand to threads
(database calls) is not in it. Profiling roughly doubles the CPU the loop
takes: read the shares, not the times.
"""

from __future__ import annotations

import cProfile
import logging
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

__all__ = ["ENV", "profiled"]

ENV = "TRUSTED_CPU_PROFILE_DIR"
LOG = logging.getLogger(__name__)


@contextmanager
def profiled(prog: str, environ: Mapping[str, str] = os.environ) -> Iterator[None]:
    """Run the body under cProfile if :data:`ENV` names a directory."""
    directory = environ.get(ENV, "")
    if not directory:
        yield
        return
    # the main thread's own CPU time: a coroutine's time suspended (waiting
    # for a thread, a socket) is not counted as its own
    profile = cProfile.Profile(time.thread_time)
    profile.enable()
    try:
        yield
    finally:
        profile.disable()
        path = os.path.join(directory, f"{prog}-{os.getpid()}.pstats")
        try:
            os.makedirs(directory, exist_ok=True)
            profile.dump_stats(path)
            LOG.info("CPU profile written to %s", path)
        except OSError as exc:
            LOG.warning("CPU profile not written to %s: %s", path, exc)
