"""A stand-in for Nova's compute API that answers two questions the way
Nova does, with the caller's Keystone token: ``GET /v2.1/servers/{uuid}``
and ``GET /v2.1/servers`` (the token's project's servers).

The token is validated with the real Keystone (``GET /v3/auth/tokens``);
a server of another project is a 404 unless the token has the ``admin``
role, and the answer carries the server's ``tenant_id``. The list is paged
as Nova pages it: at most ``max_limit`` servers a page (Nova's
``[api] max_limit``, 1000 by default), ``?limit=`` and ``?marker=`` (the
last id of the previous page; an unknown marker is a 400), and a
``servers_links`` ``next`` link on every full page. Servers are
added with :meth:`ComputeStandIn.add_server` (what a tenant's
``POST /servers`` would have made). Every request is recorded.
"""

from __future__ import annotations

import json
import re
import threading
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["ComputeStandIn"]

_SERVER = re.compile(r"^/v2\.1/servers/([0-9a-fA-F-]{36})$")
#: token -> (project id, roles), or None if Keystone refuses it
Validate = Callable[[str], "tuple[str, list[str]] | None"]


class ComputeStandIn:
    """A thread of the test process serving ``http://127.0.0.1:port/v2.1``.

    Args:
        validate: checks a token with Keystone.
    """

    def __init__(self, validate: Validate, max_limit: int = 1000) -> None:
        self.max_limit = max_limit
        self.servers: dict[str, str] = {}
        self.requests: list[str] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                owner.requests.append(self.path)
                status, body = owner.answer(self.path, self.headers.get("X-Auth-Token"))
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._validate = validate
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v2.1"

    def add_server(self, uuid: str, project_id: str) -> None:
        self.servers[uuid] = project_id

    def answer(self, path: str, token: str | None) -> tuple[int, dict[str, Any]]:
        identity = self._validate(token) if token else None
        if identity is None:
            return 401, {"error": {"message": "The request you have made requires "
                                   "authentication.", "code": 401}}  # fmt: skip
        project, roles = identity
        if path.split("?")[0] == "/v2.1/servers":  # the project's own, as Nova
            mine = [u for u, p in self.servers.items() if p == project]
            return self._page(mine, urllib.parse.urlsplit(path).query)
        match = _SERVER.match(path)
        owner = self.servers.get(match.group(1)) if match else None
        if owner is None or (owner != project and "admin" not in roles):
            return 404, {"itemNotFound": {"message": "Instance could not be found.",
                                          "code": 404}}  # fmt: skip
        return 200, {"server": {"id": match.group(1) if match else "",
                                "tenant_id": owner, "status": "BUILD"}}  # fmt: skip

    def _page(self, ids: list[str], query: str) -> tuple[int, dict[str, Any]]:
        args = urllib.parse.parse_qs(query)
        try:
            limit = min(int(args.get("limit", [self.max_limit])[0]), self.max_limit)
        except ValueError:
            return 400, {"badRequest": {"message": "limit must be an integer",
                                        "code": 400}}  # fmt: skip
        start = 0
        if "marker" in args:
            marker = args["marker"][0]
            if marker not in ids:
                return 400, {"badRequest": {"message": f"marker [{marker}] not "
                                            "found", "code": 400}}  # fmt: skip
            start = ids.index(marker) + 1
        page = ids[start : start + limit]
        body: dict[str, Any] = {"servers": [{"id": u, "links": []} for u in page]}
        if len(page) == limit:  # Nova links on from every full page
            query = urllib.parse.urlencode({"limit": limit, "marker": page[-1]})
            body["servers_links"] = [
                {"rel": "next", "href": f"{self.url}/servers?{query}"}
            ]
        return 200, body

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
