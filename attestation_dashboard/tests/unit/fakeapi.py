"""A real HTTP server on loopback answering canned JSON as the
attestation API would (status, body), recording what it was asked."""

from __future__ import annotations

import http.server
import json
import threading
from typing import Any
from urllib.parse import urlsplit

Route = tuple[str, str]  # method, path (no query)


class FakeApi:
    """Serve ``routes`` (``(method, path)`` -> ``(status, body)``; a path
    not there is the API's 404) on 127.0.0.1 until :meth:`stop`."""

    def __init__(self) -> None:
        self.routes: dict[Route, tuple[int, Any]] = {}
        self.calls: list[dict[str, Any]] = []
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                parts = urlsplit(self.path)
                api.calls.append(
                    {
                        "method": self.command,
                        "path": parts.path,
                        "query": parts.query,
                        "token": self.headers.get("X-Auth-Token"),
                        "body": json.loads(raw) if raw else None,
                    }
                )
                status, body = api.routes.get(
                    (self.command, parts.path),
                    (404, {"error": {"code": "not_found", "message": "no such thing"}}),
                )
                data = b"" if body is None else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _answer  # noqa: N815

            def log_message(self, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), daemon=True
        )
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def closed_port_url() -> str:
    """A loopback URL nothing listens on (connection refused)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"
