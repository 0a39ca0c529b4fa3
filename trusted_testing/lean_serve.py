"""A :class:`~verifier.common.lean_server.LeanApp` served on loopback for a
test, with the calls of aiohttp's ``TestServer`` and ``TestClient`` that
the tests make (``start_server``, ``make_url``, ``post``, ``close``)."""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

import aiohttp

from verifier.common import lean_server

__all__ = ["LeanTestClient", "LeanTestServer"]


class LeanTestServer:
    """``app`` on ``127.0.0.1`` at a free port, over TLS with the server
    context ``tls`` if given."""

    def __init__(
        self,
        app: lean_server.LeanApp,
        tls: ssl.SSLContext | None = None,
        **limits: float,
    ) -> None:
        self.app = app
        self.tls = tls
        self._limits = limits
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start_server(self) -> None:
        self.server = await lean_server.serve(
            self.app, "127.0.0.1", 0, self.tls, **self._limits
        )
        self.port = self.server.sockets[0].getsockname()[1]

    def make_url(self, path: str) -> str:
        scheme = "http" if self.tls is None else "https"
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
            self.server = None


class LeanTestClient:
    """A session to a :class:`LeanTestServer` (relative paths)."""

    def __init__(self, server: LeanTestServer) -> None:
        self.server = server
        self.session: aiohttp.ClientSession | None = None

    async def start_server(self) -> None:
        await self.server.start_server()
        self.session = aiohttp.ClientSession(self.server.make_url(""))

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        assert self.session is not None, "start_server() first"
        return self.session.request(method, path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> Any:
        return self.request("POST", path, **kwargs)

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.request("GET", path, **kwargs)

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
        await self.server.close()

    async def __aenter__(self) -> LeanTestClient:
        await self.start_server()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
