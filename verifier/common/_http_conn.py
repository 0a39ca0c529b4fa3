"""One kept-alive HTTP/1.1 connection of :class:`verifier.common._http_pool.Pool`.

A :class:`Connection` is an asyncio protocol that feeds the answer's bytes
straight into the framing reader (:class:`~verifier.common._http11.ResponseParser`)
as they arrive, one exchange at a time;
:class:`~verifier.common._http_tls.TlsConnection` is the same over TLS that
it runs itself.
"""

from __future__ import annotations

import asyncio
from typing import cast

from verifier.common._http11 import HttpFramingError, Response, ResponseParser

__all__ = ["Connection"]


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
        except HttpFramingError as exc:
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
            except HttpFramingError as exc:
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
            HttpFramingError: the answer is not acceptable.
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
