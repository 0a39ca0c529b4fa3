"""Running the tenant's decrypted payload (trusted-cloud-init).

Once the bootstrap has decrypted it, the payload is written to the agent's
work directory, next to the node identity (certificate and key) when the
verifier sent one (:class:`Installation`). A payload that starts with
``#!`` is executed in its own session, with its output in ``payload.out``
and its exit status in ``payload.status``; it is killed (with everything it
started) after a timeout or when the agent stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import zlib
from collections.abc import Mapping
from typing import Any, BinaryIO

from node_agent.exceptions import RefusedError
from verifier.protocol.userdata import COMPRESSED_MAGIC

__all__ = ["Installation", "run_payload", "unwrap", "write_file"]

LOG = logging.getLogger(__name__)

PAYLOAD = "payload"
PAYLOAD_OUT = "payload.out"
PAYLOAD_STATUS = "payload.status"
IDENTITY_CERT = "identity.pem"
IDENTITY_KEY = "identity-key.pem"


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


class Installation:
    """The payload a bootstrap released, in the work directory, and its run.

    Each bootstrap installs its payload and runs it at most once; a
    re-enrolment's replaces the one before (:meth:`install`, after
    :meth:`close` has stopped a run still going).

    Args:
        work_dir: the agent's work directory (absolute).
        uuid: the node UUID, told to the payload (``TRUSTED_NODE_UUID``).
    """

    def __init__(self, work_dir: str, uuid: str) -> None:
        self.work_dir = work_dir
        self.uuid = uuid
        #: the payload's exit code once it ran (None before that, or if it
        #: could not start)
        self.exit_code: int | None = None
        self._task: asyncio.Task[int | None] | None = None

    def install(self, plaintext: bytes, identity: tuple[bytes, bytes] | None) -> None:
        """Write the payload (0700) and the node identity, each on disk
        before the next; blocking.

        What an earlier bootstrap left (its run's status, an identity the
        new bootstrap does not replace) is removed first: it belongs to an
        enrolment that is gone.

        Args:
            plaintext: the decrypted payload.
            identity: the node's identity certificate (written 0644) and
                private key (0600), both PEM; None: the verifier sent none.
        """
        os.makedirs(self.work_dir, mode=0o700, exist_ok=True)
        self.exit_code = None
        stale = [PAYLOAD_STATUS] + (
            [IDENTITY_CERT, IDENTITY_KEY] if identity is None else []
        )
        for name in stale:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(name))
        if identity is not None:
            cert_pem, key_pem = identity
            write_file(self._path(IDENTITY_KEY), key_pem, 0o600)
            write_file(self._path(IDENTITY_CERT), cert_pem, 0o644)
        write_file(self._path(PAYLOAD), plaintext, 0o700)

    def start(self, with_identity: bool, timeout: float) -> None:
        """Run the installed payload in the background (see :meth:`wait`).

        Args:
            with_identity: tell it where the identity certificate and key
                are (``TRUSTED_IDENTITY_CERT``, ``TRUSTED_IDENTITY_KEY``).
            timeout: seconds before it is killed.
        """
        self._task = asyncio.create_task(self._run(with_identity, timeout))

    async def wait(self) -> int | None:
        """Wait for the payload started, if any.

        Returns:
            Its exit code (None if none was started or it could not start).
        """
        if self._task is None:
            return None
        return await self._task

    async def close(self) -> None:
        """Stop waiting for a payload still running (which kills it)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def _path(self, name: str) -> str:
        return os.path.join(self.work_dir, name)

    async def _run(self, with_identity: bool, timeout: float) -> int | None:
        env = dict(os.environ)
        env["TRUSTED_NODE_UUID"] = self.uuid
        if with_identity:
            env["TRUSTED_IDENTITY_CERT"] = self._path(IDENTITY_CERT)
            env["TRUSTED_IDENTITY_KEY"] = self._path(IDENTITY_KEY)
        status = await run_payload(
            self._path(PAYLOAD), self.work_dir, self._path(PAYLOAD_OUT), env, timeout
        )
        code: int | None = status["exit_code"]
        if "error" in status:
            LOG.error(
                "payload of node %s could not start: %s", self.uuid, status["error"]
            )
        elif status.get("timed_out"):
            LOG.error("payload of node %s killed after %.1f s", self.uuid, timeout)
        self.exit_code = code
        await asyncio.to_thread(self._write_status, status)
        LOG.info("payload of node %s exited with code %s", self.uuid, code)
        return code

    def _write_status(self, status: dict[str, Any]) -> None:
        write_file(self._path(PAYLOAD_STATUS), json.dumps(status).encode(), 0o644)
