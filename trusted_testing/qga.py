"""The hypervisor's channels into a qemu guest: the QEMU guest agent (QGA)
and the QEMU machine protocol (QMP), each a JSON-lines protocol on a unix
socket that qemu serves.

QGA is what Nova's ``hw_qemu_guest_agent`` image property wires up: a
virtio-serial port named ``org.qemu.guest_agent.0`` that the image's
``qemu-guest-agent`` serves. The tests use ``guest-exec`` /
``guest-exec-status`` to run commands as root in the guest and
``guest-file-open`` / ``guest-file-read`` to read files back
(https://qemu-project.gitlab.io/qemu/interop/qemu-ga-ref.html). QMP
(``system_reset``, ``quit``) is the monitor a cloud's compute host uses to
hard-reset a VM.

Every call opens its own connection (qemu serves one client at a time) and
first synchronises with ``guest-sync`` so that a reply left over from an
earlier, interrupted call is never taken for this one's.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import random
import socket
import time
from typing import Any

__all__ = ["ExecResult", "GuestAgent", "GuestAgentError", "Qmp"]

_READ_CHUNK = 1 << 20


class GuestAgentError(Exception):
    """The guest agent or QMP did not answer, or answered with an error."""


@dataclasses.dataclass(frozen=True)
class ExecResult:
    """What a command run with ``guest-exec`` did."""

    exit_code: int
    stdout: bytes
    stderr: bytes

    @property
    def text(self) -> str:
        """Its standard output as text."""
        return self.stdout.decode(errors="replace")


class _JsonLines:
    """One connection to a JSON-lines unix socket."""

    def __init__(self, path: str, timeout: float) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        try:
            self._sock.connect(path)
        except OSError as exc:
            self._sock.close()
            raise GuestAgentError(f"cannot connect to {path}: {exc}") from exc
        self._buffer = b""

    def send(self, message: dict[str, Any]) -> None:
        try:
            self._sock.sendall(json.dumps(message).encode() + b"\n")
        except OSError as exc:
            raise GuestAgentError(f"sending {message.get('execute')}: {exc}") from exc

    def receive(self) -> dict[str, Any]:
        """The next JSON object (skipping the 0xFF of a delimited sync)."""
        while b"\n" not in self._buffer:
            try:
                chunk = self._sock.recv(65536)
            except OSError as exc:
                raise GuestAgentError(f"no answer: {exc}") from exc
            if not chunk:
                raise GuestAgentError("the connection was closed")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        line = line.replace(b"\xff", b"").strip()
        if not line:
            return self.receive()
        try:
            value = json.loads(line)
        except ValueError as exc:
            raise GuestAgentError(f"not JSON: {line[:200]!r}") from exc
        if not isinstance(value, dict):
            raise GuestAgentError(f"not a JSON object: {line[:200]!r}")
        return value

    def close(self) -> None:
        self._sock.close()


def _result(reply: dict[str, Any], command: str) -> Any:
    if "error" in reply:
        error = reply["error"]
        raise GuestAgentError(f"{command}: {error.get('class')}: {error.get('desc')}")
    if "return" not in reply:
        raise GuestAgentError(f"{command}: unexpected reply {reply!r}"[:300])
    return reply["return"]


class GuestAgent:
    """A client of the guest's ``qemu-guest-agent`` on qemu's unix socket.

    Args:
        path: The socket qemu serves the ``org.qemu.guest_agent.0`` port on.
        timeout: Seconds to wait for one answer.
    """

    def __init__(self, path: str, timeout: float = 30.0) -> None:
        self.path = path
        self.timeout = timeout

    def call(self, command: str, arguments: dict[str, Any] | None = None) -> Any:
        """Run one QGA command; its ``return`` value.

        Raises:
            GuestAgentError: no agent, no answer in time, or an error reply.
        """
        conn = _JsonLines(self.path, self.timeout)
        try:
            token = random.randrange(1, 2**31)
            conn.send({"execute": "guest-sync", "arguments": {"id": token}})
            while conn.receive().get("return") != token:
                pass
            message: dict[str, Any] = {"execute": command}
            if arguments is not None:
                message["arguments"] = arguments
            conn.send(message)
            return _result(conn.receive(), command)
        finally:
            conn.close()

    def wait_ready(self, timeout: float) -> None:
        """Wait until the guest agent answers ``guest-ping``.

        Raises:
            GuestAgentError: it did not within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while True:
            try:
                saved, self.timeout = self.timeout, 5.0
                try:
                    self.call("guest-ping")
                finally:
                    self.timeout = saved
                return
            except GuestAgentError as exc:
                if time.monotonic() > deadline:
                    raise GuestAgentError(
                        f"the guest agent did not answer in {timeout:.0f}s: {exc}"
                    ) from exc
                time.sleep(1.0)

    def exec(
        self, argv: list[str], stdin: bytes | None = None, timeout: float = 120.0
    ) -> ExecResult:
        """Run ``argv`` in the guest (as root) and wait for it.

        Raises:
            GuestAgentError: it could not start, or did not end in time.
        """
        arguments: dict[str, Any] = {
            "path": argv[0],
            "arg": argv[1:],
            "capture-output": True,
        }
        if stdin is not None:
            arguments["input-data"] = base64.b64encode(stdin).decode()
        pid = self.call("guest-exec", arguments)["pid"]
        deadline = time.monotonic() + timeout
        while True:
            status = self.call("guest-exec-status", {"pid": pid})
            if status.get("exited"):
                break
            if time.monotonic() > deadline:
                raise GuestAgentError(f"{argv} did not end in {timeout:.0f}s")
            time.sleep(0.2)
        code = status.get("exitcode")
        if code is None:  # killed by a signal
            code = 128 + int(status.get("signal", 0))
        return ExecResult(
            int(code),
            base64.b64decode(status.get("out-data", "")),
            base64.b64decode(status.get("err-data", "")),
        )

    def shell(self, script: str, timeout: float = 120.0) -> ExecResult:
        """Run ``script`` with ``/bin/sh -c``."""
        return self.exec(["/bin/sh", "-c", script], timeout=timeout)

    def read_file(self, path: str) -> bytes:
        """The contents of a file in the guest (read as root).

        Raises:
            GuestAgentError: it cannot be opened or read.
        """
        handle = self.call("guest-file-open", {"path": path, "mode": "r"})
        data = b""
        try:
            while True:
                chunk = self.call(
                    "guest-file-read", {"handle": handle, "count": _READ_CHUNK}
                )
                data += base64.b64decode(chunk.get("buf-b64", ""))
                if chunk.get("eof") or not chunk.get("count"):
                    return data
        finally:
            self.call("guest-file-close", {"handle": handle})


class Qmp:
    """A client of qemu's monitor (QMP) on a unix socket."""

    def __init__(self, path: str, timeout: float = 30.0) -> None:
        self.path = path
        self.timeout = timeout

    def call(self, command: str, arguments: dict[str, Any] | None = None) -> Any:
        """Negotiate capabilities and run one command; its ``return`` value.

        Raises:
            GuestAgentError: qemu is not there or refused the command.
        """
        if not os.path.exists(self.path):
            raise GuestAgentError(f"no QMP socket at {self.path}")
        conn = _JsonLines(self.path, self.timeout)
        try:
            greeting = conn.receive()
            if "QMP" not in greeting:
                raise GuestAgentError(f"not a QMP greeting: {greeting!r}"[:300])
            conn.send({"execute": "qmp_capabilities"})
            _result(self._reply(conn), "qmp_capabilities")
            message: dict[str, Any] = {"execute": command}
            if arguments is not None:
                message["arguments"] = arguments
            conn.send(message)
            return _result(self._reply(conn), command)
        finally:
            conn.close()

    @staticmethod
    def _reply(conn: _JsonLines) -> dict[str, Any]:
        while True:
            reply = conn.receive()
            if "event" not in reply:  # events (RESET, ...) come in between
                return reply
