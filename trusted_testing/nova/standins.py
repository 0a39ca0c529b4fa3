"""Tiny HTTP stand-ins for the two services Nova calls on boot and delete
that this machine does not run: Glance (image service) and Neutron
(networking).

They are real HTTP servers (a thread of the test process) answering just
what Nova 34 asks for a server booted with ``networks='none'``:

* Glance v2: ``GET /v2/schemas/image`` (glanceclient builds its image model
  from it), ``GET /v2/images`` and ``GET /v2/images/{id}`` for the image
  :data:`IMAGE_ID` and any added with :meth:`StandIns.add_image`, and
  ``GET /v2/images/{id}/file`` for those added with their data; any other
  image is a 404, as Glance answers.
* Neutron v2.0: every ``GET /v2.0/<collection>`` answers an empty list
  (``{"ports": []}``, ``{"networks": []}``, ...), which is what Neutron says
  about an instance that has no ports; anything else is a 404 -- unless a
  :class:`~trusted_testing.nova.neutron_standin.NeutronState` is set
  (:attr:`StandIns.neutron`): then it answers, with a network whose ports
  Nova plugs as taps;
* Nova's dynamic vendor-data (``[api] vendordata_dynamic_targets``):
  ``POST /vendordata`` answers :attr:`StandIns.vendordata` of the body
  Nova sends (the provider's part of each instance's configuration).

Every request is recorded in :attr:`StandIns.requests` so a test can show
that Nova really called them.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from trusted_testing.nova.neutron_standin import NeutronState

IMAGE_ID = "155d900f-4e14-4e4c-a73d-069cbf4541e6"

IMAGE: dict[str, Any] = {
    "id": IMAGE_ID,
    "name": "trusted-guest",
    "status": "active",
    "visibility": "public",
    "disk_format": "raw",
    "container_format": "bare",
    "size": 1024,
    "min_disk": 0,
    "min_ram": 0,
    "protected": False,
    "tags": [],
    "owner": "provider",
    "checksum": None,
    "created_at": "2026-01-01T00:00:00Z",
    "updated_at": "2026-01-01T00:00:00Z",
    "file": f"/v2/images/{IMAGE_ID}/file",
    "schema": "/v2/schemas/image",
}

_SCHEMA: dict[str, Any] = {
    "name": "image",
    "properties": {
        "id": {"type": "string"},
        "name": {"type": ["null", "string"]},
        "status": {"type": "string"},
        "visibility": {"type": "string"},
        "disk_format": {"type": ["null", "string"]},
        "container_format": {"type": ["null", "string"]},
        "size": {"type": ["null", "integer"]},
        "min_disk": {"type": "integer"},
        "min_ram": {"type": "integer"},
        "protected": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "owner": {"type": ["null", "string"]},
        "checksum": {"type": ["null", "string"]},
        "created_at": {"type": "string"},
        "updated_at": {"type": "string"},
        "file": {"type": "string"},
        "schema": {"type": "string"},
    },
    "additionalProperties": {"type": "string"},
}


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        return

    def _send(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send_file(self, path: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(os.path.getsize(path)))
        self.end_headers()
        with open(path, "rb") as f:
            shutil.copyfileobj(f, self.wfile, 1 << 20)

    def do_GET(self) -> None:  # noqa: N802  (http.server API)
        path = urlsplit(self.path).path.rstrip("/")
        self.server.requests.append(f"GET {self.path}")
        parts = path.split("/")[1:]
        if parts == ["v2", "schemas", "image"]:
            return self._send(200, _SCHEMA)
        images = self.server.images
        if parts == ["v2", "images"]:
            return self._send(200, {"images": list(images.values())})
        if parts[:2] == ["v2", "images"] and len(parts) in (3, 4):
            if parts[2] not in images:
                return self._send(
                    404, {"message": f"No image found with ID {parts[2]}"}
                )
            if len(parts) == 3:
                return self._send(200, images[parts[2]])
            if parts[3] == "file" and parts[2] in self.server.files:
                return self._send_file(self.server.files[parts[2]])
        if parts[:1] == ["v2.0"] and self.server.neutron is not None:
            return self._neutron(parts[1:], None)
        if parts[:1] == ["v2.0"] and len(parts) == 2:
            collection = parts[1].removesuffix(".json")
            return self._send(200, {collection.replace("-", "_"): []})
        return self._send(404, {"message": f"not served by the stand-in: {path}"})

    def _neutron(self, parts: list[str], body: Any) -> None:
        assert self.server.neutron is not None
        query = parse_qs(urlsplit(self.path).query)
        status, reply = self.server.neutron.handle(self.command, parts, query, body)
        if reply is None:
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self._send(status, reply)

    def _write(self) -> None:
        self.server.requests.append(f"{self.command} {self.path}")
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"null")
        except ValueError:
            return self._send(400, {"message": "the body is not JSON"})
        parts = urlsplit(self.path).path.rstrip("/").split("/")[1:]
        if parts[:1] == ["v2.0"] and self.server.neutron is not None:
            return self._neutron(parts[1:], body)
        if parts == ["vendordata"] and self.command == "POST":
            if self.server.vendordata is None:
                return self._send(404, {"message": "no vendor-data service"})
            return self._send(200, self.server.vendordata(body))
        self._send(404, {"message": "the stand-in only answers GET"})

    do_POST = do_PUT = do_DELETE = _write  # noqa: N815


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    requests: list[str]
    images: dict[str, dict[str, Any]]
    files: dict[str, str]
    neutron: NeutronState | None
    vendordata: Callable[[Any], Any] | None


class StandIns:
    """Glance and Neutron stand-ins on one free port of 127.0.0.1."""

    def __init__(self) -> None:
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.requests = []
        self._server.images = {IMAGE_ID: IMAGE}
        self._server.files = {}
        self._server.neutron = None
        self._server.vendordata = None
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def requests(self) -> list[str]:
        return list(self._server.requests)

    @property
    def neutron(self) -> NeutronState | None:
        """The Neutron answering ``/v2.0`` (None: no ports at all)."""
        return self._server.neutron

    @neutron.setter
    def neutron(self, state: NeutronState | None) -> None:
        self._server.neutron = state

    @property
    def vendordata(self) -> Callable[[Any], Any] | None:
        """The provider's dynamic vendor-data, from Nova's request body."""
        return self._server.vendordata

    @vendordata.setter
    def vendordata(self, make: Callable[[Any], Any] | None) -> None:
        self._server.vendordata = make

    def add_image(self, image: dict[str, Any], path: str | None = None) -> None:
        """Serve one more image (Glance v2 fields, properties at the top
        level), its data read from ``path`` (``GET .../file``)."""
        self._server.images[image["id"]] = image
        if path is not None:
            self._server.files[image["id"]] = path

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():  # shutdown() would wait for ever otherwise
            self._server.shutdown()
        self._server.server_close()
