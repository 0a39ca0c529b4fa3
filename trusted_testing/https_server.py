"""A real HTTPS server (mutual TLS) on a free port, run in a thread, whose
answers a test scripts and whose requests it records."""

from __future__ import annotations

import dataclasses
import http.server
import json
import os
import ssl
import threading
from collections.abc import Callable
from typing import Any

from verifier.ca import CertificateAuthority


@dataclasses.dataclass
class Seen:
    """One request the server received."""

    method: str
    path: str
    body: bytes
    client_cn: str | None
    content_type: str | None

    def json(self) -> Any:
        return json.loads(self.body)


Handler = Callable[[Seen], tuple[int, object]]


class Pki:
    """A CA with a server certificate (127.0.0.1, localhost) and a client one."""

    def __init__(self, directory: str, client: str = "revocation-hook") -> None:
        self.dir = directory
        ca = CertificateAuthority.create(directory, "test Puppet CA")
        ca.issue_to_files(directory, "server", ["127.0.0.1", "localhost"])
        ca.issue_to_files(directory, client, [])
        self.ca_file = os.path.join(directory, "ca.pem")
        self.cert_file = os.path.join(directory, f"{client}.pem")
        self.key_file = os.path.join(directory, f"{client}-key.pem")
        self.server_cert = os.path.join(directory, "server.pem")
        self.server_key = os.path.join(directory, "server-key.pem")


class HttpsServer:
    """Serves ``handler(seen) -> (status, json body or None)`` over mTLS."""

    def __init__(self, pki: Pki, handler: Handler) -> None:
        self.seen: list[Seen] = []
        self.handler = handler
        outer = self

        class _Req(http.server.BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                peer = self.connection.getpeercert()
                cn = None
                for rdn in (peer or {}).get("subject", ()):
                    for key, value in rdn:
                        if key == "commonName":
                            cn = value
                seen = Seen(
                    self.command,
                    self.path,
                    self.rfile.read(length),
                    cn,
                    self.headers.get("Content-Type"),
                )
                outer.seen.append(seen)
                status, body = outer.handler(seen)
                data = b"" if body is None else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = _serve  # noqa: N815

            def log_message(self, *args: object) -> None:
                pass

        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=pki.ca_file)
        ctx.load_cert_chain(pki.server_cert, pki.server_key)
        ctx.verify_mode = ssl.CERT_REQUIRED
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Req)
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self.url = f"https://localhost:{self.port}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join()
