"""A lean HTTP/1.1 keep-alive client for the quote loop.

The verifier sends one small request per node per round, always to the same
few endpoints, and always over a kept-alive mTLS connection. A general
client (aiohttp) spends more CPU per request than the signature check
itself; this one keeps one connection per agent, writes the request in one
piece and reads a Content-Length (or chunked) answer. Anything unexpected
closes the connection and raises :class:`HttpError`; the caller treats it
as the agent being unreachable.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping
from urllib.parse import urlencode

__all__ = ["HttpError", "KeepAliveClient"]

_MAX_HEADER = 16 * 1024
_MAX_BODY = 8 * 1024 * 1024  # an IMA list part (4 MiB) and a firmware log


class HttpError(Exception):
    """The exchange failed (connection, TLS, timeout, or a bad answer)."""


class _Connection:
    __slots__ = ("lock", "reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader = reader
        self.writer = writer
        self.lock = asyncio.Lock()

    def close(self) -> None:
        self.writer.close()


async def _read_body(
    reader: asyncio.StreamReader, headers: dict[bytes, bytes]
) -> bytes:
    if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
        chunks: list[bytes] = []
        total = 0
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            total += size
            if total > _MAX_BODY:
                raise HttpError("answer too large")
            if size == 0:
                await reader.readuntil(b"\r\n")
                return b"".join(chunks)
            chunks.append(await reader.readexactly(size))
            await reader.readexactly(2)
    length = int(headers.get(b"content-length", b"-1"))
    if not 0 <= length <= _MAX_BODY:
        raise HttpError("answer without a valid Content-Length")
    return await reader.readexactly(length)


class KeepAliveClient:
    """One kept-alive connection per (host, port), requests serialised on it.

    Args:
        timeout: seconds for one whole exchange (connect included).
    """

    def __init__(self, timeout: float) -> None:
        self._timeout = timeout
        self._connections: dict[tuple[str, int], _Connection] = {}

    async def _connect(
        self, host: str, port: int, ctx: ssl.SSLContext, pin: bytes | None
    ) -> _Connection:
        conn = self._connections.get((host, port))
        if conn is None or conn.writer.is_closing():
            reader, writer = await asyncio.open_connection(host, port, ssl=ctx)
            if pin is not None:
                peer = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
                if peer != pin:
                    writer.close()
                    raise HttpError("server certificate is not the pinned one")
            conn = _Connection(reader, writer)
            self._connections[(host, port)] = conn
        return conn

    async def request(
        self,
        method: str,
        host: str,
        port: int,
        ctx: ssl.SSLContext,
        path: str,
        params: Mapping[str, str] | None = None,
        body: bytes | None = None,
        pin: bytes | None = None,
    ) -> tuple[int, bytes]:
        """One exchange; returns (status, body).

        Args:
            pin: DER of the only server certificate to accept (checked when
                the connection is made; use with a context that does not
                verify certificates itself).

        Raises:
            HttpError: on any failure (the connection is dropped).
        """
        target = path + ("?" + urlencode(params) if params else "")
        head = f"{method} {target} HTTP/1.1\r\nHost: {host}:{port}\r\n"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        data = (head + "\r\n").encode() + (body or b"")
        try:
            async with asyncio.timeout(self._timeout):
                conn = await self._connect(host, port, ctx, pin)
                async with conn.lock:
                    return await self._exchange(conn, data)
        except (
            OSError,
            ssl.SSLError,
            TimeoutError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            ValueError,
            HttpError,
        ) as exc:
            self.drop(host, port)
            if isinstance(exc, HttpError):
                raise
            raise HttpError(f"{type(exc).__name__}: {exc}") from exc

    async def _exchange(self, conn: _Connection, data: bytes) -> tuple[int, bytes]:
        conn.writer.write(data)
        head = await conn.reader.readuntil(b"\r\n\r\n")
        if len(head) > _MAX_HEADER:
            raise HttpError("answer headers too large")
        lines = head.split(b"\r\n")
        status_line = lines[0].split(b" ", 2)
        if len(status_line) < 2 or not status_line[0].startswith(b"HTTP/1."):
            raise HttpError("not an HTTP/1.x answer")
        headers: dict[bytes, bytes] = {}
        for line in lines[1:]:
            if line:
                key, _, value = line.partition(b":")
                headers[key.strip().lower()] = value.strip()
        payload = await _read_body(conn.reader, headers)
        if headers.get(b"connection", b"").lower() == b"close":
            conn.close()
        return int(status_line[1]), payload

    def drop(self, host: str, port: int) -> None:
        """Close and forget the connection to (host, port), if any."""
        conn = self._connections.pop((host, port), None)
        if conn is not None:
            conn.close()

    async def close(self) -> None:
        for conn in self._connections.values():
            conn.close()
        self._connections.clear()
