"""Process CPU time, resident memory and open sockets from /proc, for the
benchmarks."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import Prehashed


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


def ecdsa_floor(seconds: float = 0.5) -> dict[str, float]:
    """CPU microseconds of one ECDSA P-256 verify (of a SHA-256 digest, as
    the verifier checks a quote) and of one sign (as the emulated TPM
    quotes), measured in this process now: the floor a check cannot go
    below, on this machine under its present load (process CPU time, so
    other processes' load counts little)."""
    key = ec.generate_private_key(ec.SECP256R1())
    public = key.public_key()
    digest = hashlib.sha256(b"quote").digest()
    prehashed = ec.ECDSA(Prehashed(hashes.SHA256()))
    signature = key.sign(digest, prehashed)

    def per_call(fn: Callable[[], object]) -> float:
        calls, t0 = 0, time.process_time()
        while (spent := time.process_time() - t0) < seconds:
            for _ in range(100):
                fn()
            calls += 100
        return spent / calls * 1e6

    return {
        "verify_us": per_call(lambda: public.verify(signature, digest, prehashed)),
        "sign_us": per_call(lambda: key.sign(digest, prehashed)),
    }
