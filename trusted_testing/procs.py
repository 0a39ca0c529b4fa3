"""Process helpers of the test deployments: children that die with their
parent, waiting for a port or a condition, service configuration files."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from typing import Any

__all__ = ["WaitTimeoutError", "die_with_parent", "wait_port", "wait_until"]

_PR_SET_PDEATHSIG = 1


def spawn(argv: list[str], log_path: str) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a session of its own, its output to ``log_path``,
    stopped when this process dies (:func:`die_with_parent`).

    Raises:
        FileNotFoundError: the program is not installed.
    """
    with open(log_path, "wb") as out:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent,  # noqa: PLW1509
        )


def die_with_parent() -> None:
    """In a child before exec: get SIGTERM when the parent dies, however it
    dies, so a killed test run or benchmark leaves no service behind."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def wait_port(
    port: int, proc: subprocess.Popen[bytes] | None, log: str, timeout: float = 30.0
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(
                f"process exited ({proc.returncode}); see {log}:\n" + _tail(log)
            )
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port}; see {log}:\n" + _tail(log))


def _tail(path: str, lines: int = 15) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return "(no log)"


def _write_conf(path: str, sections: dict[str, dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for section, values in sections.items():
            f.write(f"[{section}]\n")
            for key, value in values.items():
                if isinstance(value, list):
                    value = ",".join(value)
                f.write(f"{key} = {value}\n")
            f.write("\n")


class WaitTimeoutError(AssertionError):
    """What :func:`wait_until` waited for did not happen in time (an
    ``AssertionError``: in a test it is a failure, not an error)."""

    def __init__(self, what: str, timeout: float, last: Any) -> None:
        shown = repr(last)
        if len(shown) > 200:
            shown = shown[:200] + "..."
        super().__init__(f"{what} not within {timeout:g} s (last value: {shown})")
        self.what = what
        self.timeout = timeout
        self.last = last


def wait_until(
    predicate: Callable[[], Any],
    timeout: float,
    step: float = 0.1,
    what: str = "",
) -> Any:
    """Poll ``predicate`` until it returns something truthy; that value.

    Args:
        predicate: called every ``step`` seconds.
        timeout: seconds to wait at most.
        step: seconds between calls.
        what: what is awaited, for the error ("node 3 registered").

    Raises:
        WaitTimeoutError: ``predicate`` was still falsy after ``timeout``.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            name = getattr(predicate, "__qualname__", "condition")
            raise WaitTimeoutError(what or name, timeout, value)
        time.sleep(step)


def listening(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:``port``."""
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def kill_group(proc: subprocess.Popen[bytes] | None, port: int) -> None:
    """SIGKILL ``proc``'s process group (a crash, not a clean stop) and wait
    up to 10 s until nothing listens on ``port`` any more."""
    if proc is not None and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 10
    while listening(port) and time.monotonic() < deadline:
        time.sleep(0.1)
