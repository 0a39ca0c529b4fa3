"""Kept-alive HTTP/1.1 connections for :class:`verifier.common.http.AsyncClient`.

A :class:`Pool` keeps idle connections
(:class:`~verifier.common._http_conn.Connection`) per origin (and per
pinned certificate), drops them when the peer closed them or they idled too
long, and checks a pinned certificate right after the handshake. TLS
connections run TLS themselves (:mod:`verifier.common._http_tls`), all of
a pool's reading through one buffer.
"""

from __future__ import annotations

import asyncio
import ssl
import time

from verifier.common._http11 import Origin
from verifier.common._http_conn import Connection
from verifier.common._http_tls import READ_SIZE, TlsConnection
from verifier.common.tls import check_pin

__all__ = ["Pool"]


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
