"""Running the tenant's decrypted payload (trusted-cloud-init).

A payload that starts with ``#!`` is executed in its own session, with its
output in ``payload.out`` and its exit status in ``payload.status``; it is
killed (with everything it started) after a timeout or when the agent
stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import zlib
from collections.abc import Mapping
from typing import Any, BinaryIO

from node_agent.exceptions import RefusedError
from verifier.protocol.userdata import COMPRESSED_MAGIC

__all__ = ["run_payload", "unwrap", "write_file"]


def write_file(path: str, data: bytes, mode: int) -> None:
    """Write ``data`` to ``path`` with permissions ``mode`` (also if it
    exists), on disk before it returns: a node reset right after keeps it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as out:
        os.fchmod(out.fileno(), mode)
        out.write(data)
        out.flush()
        os.fsync(out.fileno())


def unwrap(plaintext: bytes, limit: int) -> bytes:
    """Undo the boot wrapper's compression (``TCZ1`` + zlib), refusing to
    inflate past ``limit`` bytes.

    Raises:
        RefusedError: ``bad_payload``, corrupt or too large once inflated.
    """
    if not plaintext.startswith(COMPRESSED_MAGIC):
        return plaintext
    inflater = zlib.decompressobj()
    try:
        data = inflater.decompress(plaintext[len(COMPRESSED_MAGIC) :], limit + 1)
    except zlib.error:
        data = b""
    if len(data) > limit or not inflater.eof:
        raise RefusedError("bad_payload", "compressed payload is corrupt or too large")
    return data


def _kill_group(pid: int) -> None:
    """SIGKILL the payload and whatever it started (its own session)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


async def run_payload(
    program: str, work_dir: str, output: str, env: Mapping[str, str], timeout: float
) -> dict[str, Any]:
    """Run ``program`` in ``work_dir`` with stdout+stderr to ``output``.

    The output is on disk when it returns (the payload runs once: a node
    reset later must not leave an empty ``payload.out`` behind).

    Returns:
        The status to record: ``{"exit_code": n}``, plus ``"timed_out":
        True`` when it was killed after ``timeout`` seconds, or
        ``{"exit_code": None, "error": ...}`` when it could not start.
    """
    with open(output, "wb") as out:
        status = await _supervise(program, work_dir, out, env, timeout)
        await asyncio.to_thread(os.fsync, out.fileno())
    return status


async def _supervise(
    program: str,
    work_dir: str,
    out: BinaryIO,
    env: Mapping[str, str],
    timeout: float,
) -> dict[str, Any]:
    """Start ``program`` with its output to ``out`` and wait for it."""
    try:
        proc = await asyncio.create_subprocess_exec(
            program,
            cwd=work_dir,
            env=dict(env),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as exc:
        return {"exit_code": None, "error": str(exc)}
    try:
        return {"exit_code": await asyncio.wait_for(proc.wait(), timeout)}
    except asyncio.CancelledError:  # the agent is shutting down
        _kill_group(proc.pid)
        raise
    except TimeoutError:
        _kill_group(proc.pid)
        return {"exit_code": await proc.wait(), "timed_out": True}
