"""Kept-alive HTTP/1.1 connections for :class:`verifier.common.http.AsyncClient`.

A :class:`Connection` is an asyncio protocol that feeds the answer's bytes
straight into the framing reader (:class:`~verifier.common._http11.ResponseParser`)
as they arrive; a :class:`Pool` keeps idle connections per origin (and per
pinned certificate), drops them when the peer closed them or they idled too
long, and checks a pinned certificate right after the handshake. TLS
connections run TLS themselves (:mod:`verifier.common._http_tls`), all of
a pool's reading through one buffer.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from typing import cast

from verifier.common._http11 import Origin, ProtocolError, Response, ResponseParser
from verifier.common.tls import check_pin

__all__ = ["Connection", "Pool"]


class Connection(asyncio.Protocol):
    """One kept-alive connection carrying one exchange at a time."""

    __slots__ = ("_parser", "_waiter", "idle_since", "lost", "pin", "transport")

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.pin: bytes | None = None
        self.idle_since = 0.0
        self.lost = False
        self._parser: ResponseParser | None = None
        self._waiter: asyncio.Future[Response] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._data(data)

    def _data(self, data: bytes) -> None:
        """Bytes of the answer (plaintext, whatever the transport)."""
        parser = self._parser
        if parser is None or parser.done:  # unsolicited bytes: desynchronised
            self.close()
            return
        try:
            parser.feed(data)
        except ProtocolError as exc:
            self._settle(exc)
            return
        if parser.done:
            self._settle(None)

    def eof_received(self) -> bool | None:
        self._eof()
        return None  # close the transport

    def _eof(self) -> None:
        """The peer ended the stream (plaintext EOF, whatever the transport)."""
        parser = self._parser
        if parser is not None and not parser.done:
            try:
                parser.feed_eof()
            except ProtocolError as exc:
                self._settle(exc)
                return
            self._settle(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._settle(exc or ConnectionResetError("connection closed by the peer"))

    def _settle(self, exc: BaseException | None) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        if exc is not None:
            waiter.set_exception(exc)
        else:
            assert self._parser is not None and self._parser.result is not None
            waiter.set_result(self._parser.result)

    async def exchange(self, data: bytes, parser: ResponseParser) -> Response:
        """Write one request and wait for its answer.

        Raises:
            ProtocolError: the answer is not acceptable.
            ConnectionError: the connection was lost.
        """
        assert self.transport is not None
        waiter: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        self._parser, self._waiter = parser, waiter
        try:
            self._send(data)
            return await waiter
        finally:
            self._parser = self._waiter = None

    def _send(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def usable(self, now: float, idle_timeout: float) -> bool:
        """Still open, and idle for less than ``idle_timeout`` seconds."""
        transport = self.transport
        return (
            not self.lost
            and transport is not None
            and not transport.is_closing()
            and now - self.idle_since < idle_timeout
        )

    def close(self) -> None:
        if self.transport is not None:
            self.transport.abort()


class Pool:
    """Idle connections per origin.

    Args:
        max_idle: idle connections kept per origin.
        idle_timeout: seconds an idle connection is kept.
    """

    def __init__(self, max_idle: int, idle_timeout: float) -> None:
        self._max_idle = max_idle
        self._idle_timeout = idle_timeout
        self._idle: dict[Origin, list[Connection]] = {}
        self._closed = False
        # one read buffer for every TLS connection of the pool (see _http_tls)
        self._buffer: memoryview | None = None

    async def connect(
        self, origin: Origin, context: ssl.SSLContext | None, pin: bytes | None
    ) -> Connection:
        """A new connection (TLS with ``context``), its peer's certificate
        checked against ``pin`` before anything is sent.

        Raises:
            OSError: refused, TLS failure, or not the pinned certificate.
        """
        loop = asyncio.get_running_loop()
        if context is None:
            _, conn = await loop.create_connection(Connection, origin.host, origin.port)
            return conn
        from verifier.common._http_tls import READ_SIZE, TlsConnection

        if self._buffer is None:
            self._buffer = memoryview(bytearray(READ_SIZE))
        buffer = self._buffer
        made: list[TlsConnection] = []

        def factory() -> TlsConnection:
            made.append(TlsConnection(context, origin.host, buffer))
            return made[0]

        try:
            _, tls = await loop.create_connection(factory, origin.host, origin.port)
        except BaseException:
            for conn in made:
                conn.forget_handshake()
                conn.close()
            raise
        try:
            await tls.handshake()
            if pin is not None:
                check_pin(tls.ssl_object, pin)
        except BaseException:  # refused, or cancelled by the timeout
            tls.close()
            raise
        tls.pin = pin
        return tls

    def take(self, origin: Origin, pin: bytes | None) -> Connection | None:
        """An idle, still usable connection to ``origin`` with ``pin``."""
        idle = self._idle.get(origin)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if conn.pin == pin and conn.usable(now, self._idle_timeout):
                return conn
            conn.close()
        return None

    def put(self, origin: Origin, conn: Connection) -> None:
        """Keep ``conn`` for the next request (or close it)."""
        idle = self._idle.setdefault(origin, [])
        if self._closed or len(idle) >= self._max_idle:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        idle.append(conn)

    def forget(self, origin: Origin) -> None:
        """Close the idle connections to ``origin``."""
        for conn in self._idle.pop(origin, ()):
            conn.close()

    def close(self) -> None:
        """Close every idle connection; later ones are closed when put back."""
        self._closed = True
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()
