"""Process CPU time, resident memory and open sockets from /proc, for the
benchmarks."""

from __future__ import annotations

import os


def cpu_seconds(pid: int | str = "self") -> float:
    """User plus system CPU time of a process, in seconds."""
    return sum(cpu_split(pid))


def cpu_split(pid: int | str = "self") -> tuple[float, float]:
    """User and system (kernel) CPU time of a process, in seconds."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def rss_kib(pid: int | str = "self") -> int:
    """Resident set size of a process, in KiB."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def sockets(pid: int) -> int:
    """Open sockets of a process (its connections, listeners included)."""
    fds = f"/proc/{pid}/fd"
    count = 0
    for fd in os.listdir(fds):
        try:
            count += os.readlink(os.path.join(fds, fd)).startswith("socket:")
        except OSError:
            pass
    return count
