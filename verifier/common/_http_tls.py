"""TLS for the kept-alive connections of :mod:`verifier.common._http_pool`.

The event loops' own TLS protocols keep a read buffer per connection:
CPython's ``asyncio.sslproto`` a zero-filled 256 KiB bytearray (all of it
resident), uvloop's a 256 KiB block of which the pages the reads touched
stay resident, tens of KB per idle kept-alive connection, 6 GB at
100,000 nodes. Here TLS runs over :class:`ssl.MemoryBIO` in a
:class:`asyncio.BufferedProtocol` whose reads all land in ONE buffer owned
by the pool: a read is handled synchronously (fed to the TLS object, the
plaintext to the answer's parser) before the loop reads again, so no two
connections ever hold it at once. An idle connection then costs its
OpenSSL object (which releases its own record buffers when idle), the
transport and a few small objects.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import TYPE_CHECKING, cast

from verifier.common._http_conn import Connection

__all__ = ["READ_SIZE", "TlsBio", "TlsConnection", "wrap"]

READ_SIZE = 256 * 1024  # the shared read buffer: a large answer in few reads
_RECORD = 16 * 1024  # the largest plaintext of one TLS record (RFC 8446 5.1)


def wrap(
    context: ssl.SSLContext, server_side: bool, server_hostname: str | None = None
) -> tuple[ssl.MemoryBIO, ssl.MemoryBIO, ssl.SSLObject]:
    """The incoming and outgoing BIOs of a new TLS object, and the object."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(
        incoming, outgoing, server_side=server_side, server_hostname=server_hostname
    )
    return incoming, outgoing, tls


class TlsBio:
    """TLS run over :class:`ssl.MemoryBIO` s, its reads landing in a buffer
    shared by many connections: mixed into a protocol (before it) that has
    ``transport`` and ``lost`` attributes and ``_data`` (plaintext),
    ``_eof`` (the peer ended the stream), ``_settle`` (the connection
    failed) and ``_end_handshake`` (None: done; else why it failed) --
    the client's :class:`TlsConnection` and the lean server's
    (:mod:`verifier.common.lean_server`). The class using it keeps the
    state in its ``__slots__``: ``_buffer``, and ``_incoming``,
    ``_outgoing`` and ``_tls`` from :func:`wrap`."""

    __slots__ = ()
    transport: asyncio.Transport | None
    lost: bool
    _buffer: memoryview
    _incoming: ssl.MemoryBIO
    _outgoing: ssl.MemoryBIO
    _tls: ssl.SSLObject

    @property
    def ssl_object(self) -> ssl.SSLObject:
        return self._tls

    if TYPE_CHECKING:  # the hooks of the protocol using it

        @property
        def _handshaking(self) -> bool:
            """The handshake is under way."""

        @property
        def _tls_ready(self) -> bool:
            """The handshake succeeded."""

        def _data(self, data: bytes) -> None:
            """Plaintext arrived."""

        def _eof(self) -> None:
            """The peer ended the stream."""

        def _settle(self, exc: BaseException | None) -> None:
            """The connection failed (``exc``)."""

        def _end_handshake(self, exc: BaseException | None) -> None:
            """The handshake ended (None) or failed (``exc``)."""

    # -- the transport's side
    def get_buffer(self, sizehint: int) -> memoryview:
        return self._buffer

    def buffer_updated(self, nbytes: int) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        self._incoming.write(self._buffer[:nbytes])
        if self._handshaking:
            self._step_handshake()
        else:
            self._read_plaintext()

    def data_received(self, data: bytes) -> None:  # not a buffered transport
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        self._incoming.write(data)
        if self._handshaking:
            self._step_handshake()
        else:
            self._read_plaintext()

    def _tls_eof(self) -> None:
        """The TCP stream ended (no more bytes will come)."""
        self._incoming.write_eof()

    def _step_handshake(self) -> None:
        try:
            self._tls.do_handshake()
        except ssl.SSLWantReadError:
            self._flush()
            return
        except Exception as exc:  # any failure of the handshake fails it
            self._flush()  # the alert, for the peer's log
            self._end_handshake(exc)
            self.close()
            return
        self._flush()
        self._end_handshake(None)
        # records behind the handshake (TLS 1.3 session tickets) or, from a
        # peer that speaks before it is asked, bytes that close the connection
        self._read_plaintext()

    def _read_plaintext(self) -> None:
        tls, incoming = self._tls, self._incoming
        # read only while there are bytes to read: a read that finds none
        # makes OpenSSL allocate its 17 KB record buffer and keep it until
        # the next record, so every idle connection would hold one
        while incoming.pending or tls.pending():
            try:
                data = tls.read(_RECORD)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLEOFError:  # TCP ended without close_notify
                self._settle(ConnectionResetError("connection closed by the peer"))
                self.close()
                return
            except ssl.SSLZeroReturnError:
                data = b""
            except ssl.SSLError as exc:
                self._settle(exc)
                self.close()
                return
            if not data:  # close_notify: the peer ended the stream cleanly
                self._flush()
                self._eof()
                self.close()
                return
            self._data(data)
            if self.transport is None or self.transport.is_closing():
                return
        self._flush()  # a key update answered, for instance

    def _flush(self) -> None:
        data = self._outgoing.read()
        transport = self.transport
        if data and transport is not None and not transport.is_closing():
            transport.write(data)

    def _send(self, data: bytes) -> None:
        self._tls.write(data)
        self._flush()

    def close(self) -> None:
        """Send close_notify and close once it is written (abort if the
        connection is broken or the handshake unfinished)."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if self.lost or self._handshaking or not self._tls_ready:  # broken, unfinished
            transport.abort()
            return
        try:
            self._tls.unwrap()
        except ssl.SSLWantReadError:  # the peer's close_notify is not awaited
            pass
        except ssl.SSLError:
            transport.abort()
            return
        self._flush()
        transport.close()


class TlsConnection(TlsBio, Connection, asyncio.BufferedProtocol):
    """A :class:`Connection` carrying TLS itself.

    Args:
        context: the client TLS context.
        server_hostname: the name checked (if the context checks names)
            and sent as SNI.
        buffer: the read buffer shared by every connection of a pool.
    """

    __slots__ = ("_buffer", "_handshake", "_incoming", "_outgoing", "_tls")

    def __init__(
        self, context: ssl.SSLContext, server_hostname: str, buffer: memoryview
    ) -> None:
        super().__init__()
        self._buffer = buffer
        self._incoming, self._outgoing, self._tls = wrap(
            context, False, server_hostname
        )
        self._handshake: asyncio.Future[None] | None = (
            asyncio.get_running_loop().create_future()
        )

    async def handshake(self) -> None:
        """Wait for the TLS handshake (started when the TCP connection is
        made).

        Raises:
            ssl.SSLError: the handshake failed (a certificate not accepted
                is an :class:`ssl.SSLCertVerificationError`).
            ConnectionError: the peer closed the connection meanwhile.
        """
        if self._handshake is not None:
            await self._handshake

    def forget_handshake(self) -> None:
        """The handshake's outcome will never be awaited (the connection
        failed before it could be): do not log it as unretrieved."""
        waiter = self._handshake
        if waiter is not None and waiter.done() and not waiter.cancelled():
            waiter.exception()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self._step_handshake()

    def eof_received(self) -> bool | None:
        # a TCP end without TLS close_notify: an answer not complete by
        # then was cut short (or truncated by someone in between)
        self._tls_eof()
        if self._handshaking:
            self._end_handshake(ConnectionResetError("closed during the TLS handshake"))
        else:
            self._read_plaintext()
            self._settle(ConnectionResetError("connection closed by the peer"))
        return None  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._end_handshake(
            exc or ConnectionResetError("connection closed by the peer")
        )
        super().connection_lost(exc)

    @property
    def _handshaking(self) -> bool:
        return self._handshake is not None and not self._handshake.done()

    @property
    def _tls_ready(self) -> bool:
        return self._handshake is None

    def _end_handshake(self, exc: BaseException | None) -> None:
        waiter = self._handshake
        if waiter is None or waiter.done():
            return
        if exc is None:
            self._handshake = None  # done: nothing to keep
            waiter.set_result(None)
        else:  # kept failed for handshake() to raise
            waiter.set_exception(exc)
