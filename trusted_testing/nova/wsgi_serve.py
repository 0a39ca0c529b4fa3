"""Serve Nova's compute API or Placement as a process of its own.

``python -m trusted_testing.nova.wsgi_serve PORT nova|placement``

The WSGI applications are the ones the projects ship for Apache/uWSGI
(``nova.wsgi.osapi_compute``, ``placement.wsgi``), configured the same way
(``OS_NOVA_CONFIG_DIR``/``OS_NOVA_CONFIG_FILES``,
``OS_PLACEMENT_CONFIG_DIR``); only the HTTP server is the standard
library's, with a thread per request.
"""

from __future__ import annotations

import socketserver
import sys
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        return


def _application(which: str) -> Any:
    if which == "nova":
        from nova.wsgi.osapi_compute import application

        return application
    if which == "placement":
        from placement.wsgi import init_application

        return init_application()
    raise SystemExit(f"unknown application {which!r}: nova or placement")


def main(argv: list[str]) -> int:
    port, which = int(argv[0]), argv[1]
    del sys.argv[1:]  # the applications parse the command line as their own
    app = _application(which)
    server = make_server(
        "127.0.0.1",
        port,
        app,
        server_class=_ThreadingServer,
        handler_class=_QuietHandler,
    )
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
