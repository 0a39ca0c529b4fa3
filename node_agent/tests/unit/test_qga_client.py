"""The test harness's qemu guest agent and QMP clients, against a fake
server on a real unix socket (what qemu's chardev serves)."""

from __future__ import annotations

import base64
import json
import os
import socket
import threading
from collections.abc import Callable
from typing import Any

import fixtures
import testtools

from trusted_testing.qga import GuestAgent, GuestAgentError, Qmp

Handler = Callable[[dict[str, Any]], list[dict[str, Any]]]


class _Server:
    """Answers each JSON line with what ``handler`` returns; one client at
    a time, like qemu's socket chardev."""

    def __init__(self, path: str, handler: Handler, greeting: bytes = b"") -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(1)
        self.handler, self.greeting = handler, greeting
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn, conn.makefile("rb") as lines:
                conn.sendall(self.greeting)
                for line in lines:
                    for reply in self.handler(json.loads(line)):
                        conn.sendall(json.dumps(reply).encode() + b"\n")


class TestGuestAgent(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.path = os.path.join(self.useFixture(fixtures.TempDir()).path, "qga")

    def serve(self, handler: Handler, greeting: bytes = b"") -> None:
        server = _Server(self.path, handler, greeting)
        self.addCleanup(server.sock.close)

    def test_a_stale_reply_before_the_sync_is_skipped(self) -> None:
        def handler(msg: dict[str, Any]) -> list[dict[str, Any]]:
            if msg["execute"] == "guest-sync":
                # a reply left over from an interrupted call comes first
                return [{"return": {"pid": 1}}, {"return": msg["arguments"]["id"]}]
            return [{"return": {"version": "7.2"}}]

        self.serve(handler)
        self.assertEqual({"version": "7.2"}, GuestAgent(self.path).call("guest-info"))

    def test_exec_and_read_file(self) -> None:
        data = b"x" * 10

        def handler(msg: dict[str, Any]) -> list[dict[str, Any]]:
            name, args = msg["execute"], msg.get("arguments", {})
            answers: dict[str, Any] = {
                "guest-sync": args.get("id"),
                "guest-exec": {"pid": 7},
                "guest-exec-status": {
                    "exited": True,
                    "exitcode": 3,
                    "out-data": base64.b64encode(b"out").decode(),
                },
                "guest-file-open": 5,
                "guest-file-read": {
                    "count": len(data),
                    "buf-b64": base64.b64encode(data).decode(),
                    "eof": True,
                },
                "guest-file-close": {},
            }
            return [{"return": answers[name]}]

        self.serve(handler)
        agent = GuestAgent(self.path)
        done = agent.exec(["/bin/true"])
        self.assertEqual((3, b"out", b""), (done.exit_code, done.stdout, done.stderr))
        self.assertEqual(data, agent.read_file("/etc/hostname"))

    def test_an_error_reply_is_a_named_error(self) -> None:
        def handler(msg: dict[str, Any]) -> list[dict[str, Any]]:
            if msg["execute"] == "guest-sync":
                return [{"return": msg["arguments"]["id"]}]
            return [{"error": {"class": "GenericError", "desc": "no such file"}}]

        self.serve(handler)
        exc = self.assertRaises(
            GuestAgentError, GuestAgent(self.path).read_file, "/nope"
        )
        self.assertIn("no such file", str(exc))

    def test_no_agent_is_a_named_error(self) -> None:
        self.assertRaises(GuestAgentError, GuestAgent(self.path).call, "guest-ping")
        self.assertRaises(GuestAgentError, GuestAgent(self.path).wait_ready, 0.0)

    def test_qmp_negotiates_and_skips_events(self) -> None:
        def handler(msg: dict[str, Any]) -> list[dict[str, Any]]:
            if msg["execute"] == "qmp_capabilities":
                return [{"return": {}}]
            return [{"event": "RESET", "data": {}}, {"return": {}}]

        self.serve(handler, b'{"QMP": {"version": {}}}\n')
        self.assertEqual({}, Qmp(self.path).call("system_reset"))
