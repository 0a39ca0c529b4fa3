"""A lean HTTP/1.1 server for endpoints whose work is in memory.

The verifier's push endpoint answers each request from memory, without
waiting on anything (:mod:`verifier.api.push_app`). Served by aiohttp, its
request path -- a task per connection, a request object with multidict
headers and a yarl URL, the router, two middlewares, a response object --
cost more CPU than judging the evidence (``doc/source/perf/http_engine.rst``).
Here a connection is an :class:`asyncio.Protocol`: the bytes that arrive
are framed by :class:`~verifier.common._http11_request.RequestParser`,
each complete request is answered by its route's handler at once, on the
event loop, and the answer written; nothing else is allocated per request.

Handlers are plain functions ``handler(request, params) -> (status,
data)``; ``data`` is written as JSON. A handler that knows its client will
not be back soon answers :class:`LastAnswer` instead: the connection is
closed after it rather than kept idle. They raise
:class:`~verifier.common.errors.RequestError` (or one of the protocol's
malformed-input errors) to refuse, answered with the shared JSON error
body as on every service (:mod:`verifier.common.web`); any other error is
logged and answered ``500`` with the generic body. Every answer carries a
request id, ``GET /healthcheck`` answers ``OK`` and ``GET
/v1/openapi.json`` the routes' OpenAPI document.

Connections are kept alive between requests for ``keepalive`` seconds;
a request must arrive whole within ``request_timeout`` seconds of its
first byte (a slow client is cut off, not waited for); a client that does
not read its answers stops being read from.
"""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
import time
from collections.abc import Callable, Mapping
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, NamedTuple, cast

import orjson

from verifier.common import conventions
from verifier.common._http11_request import BadRequestError, Request, RequestParser
from verifier.common._http_tls import READ_SIZE, TlsBio, wrap
from verifier.common.api_schemas import Responses
from verifier.common.errors import RequestError
from verifier.protocol.errors import EnvelopeError, MalformedError
from verifier.protocol.messages.errors import MAX_ERROR_MESSAGE, ErrorBody

__all__ = ["LastAnswer", "LeanApp", "LeanHandler", "Request", "Route", "serve"]

LOG = logging.getLogger(__name__)

#: ``handler(request, path parameters) -> (status, JSON-able data)``
LeanHandler = Callable[[Request, Mapping[str, str]], tuple[int, Any]]
_PARAM = re.compile(r"{(\w+)}")
_REASONS = {s.value: s.phrase for s in HTTPStatus}
_JSON = "application/json"
_HIGH_WATER = 256 * 1024  # bytes of answers unsent before reading stops
_LINGER = 1.0  # seconds a refused connection's further bytes are dropped


class LastAnswer(NamedTuple):
    """A handler's answer after which the connection is closed (with
    ``Connection: close``): its client's next request is further off than
    the connection would be kept idle, so keeping it only holds memory."""

    status: int
    data: Any


class Route(NamedTuple):
    """One route: ``template`` is a path with ``{name}`` segments."""

    method: str
    template: str
    handler: LeanHandler
    pattern: re.Pattern[str]


def _error_data(code: str, message: str) -> dict[str, Any]:
    # the shared JSON error body, as verifier.common.web answers it
    return ErrorBody(code or "error", message[:MAX_ERROR_MESSAGE]).to_dict()


class _Clock:
    """The Date field's value, formatted once a second."""

    __slots__ = ("_second", "_text")

    def __init__(self) -> None:
        self._second = -1
        self._text = ""

    def date(self) -> str:
        now = int(time.time())
        if now != self._second:
            self._second, self._text = now, formatdate(now, usegmt=True)
        return self._text


class LeanApp:
    """Routes and the answers to requests.

    Args:
        title: the service's name (in its OpenAPI document).
        max_body: the largest request body taken (bytes).
        too_large: the code and message answered (413) to a larger one.
        responses: success schemas by (METHOD, template) for the OpenAPI
            document (:mod:`verifier.common.api_schemas`).
    """

    def __init__(
        self,
        title: str,
        max_body: int,
        too_large: tuple[str, str] = ("too_large", "request body is too large"),
        responses: Responses | None = None,
    ) -> None:
        self.title = title
        self.max_body = max_body
        self.too_large = too_large
        self._responses = responses
        self._routes: list[Route] = []
        self._openapi: dict[str, Any] | None = None
        self._clock = _Clock()
        self.add("GET", "/v1/openapi.json", self._serve_openapi)

    def add(self, method: str, template: str, handler: LeanHandler) -> None:
        """Route ``method template`` to ``handler``."""
        pattern = "".join(
            f"(?P<{part[1:-1]}>[^/]+)" if _PARAM.fullmatch(part) else re.escape(part)
            for part in re.split(r"({\w+})", template)
        )
        self._routes.append(Route(method, template, handler, re.compile(pattern)))

    @property
    def routes(self) -> list[Route]:
        return list(self._routes)

    def document(self) -> dict[str, Any]:
        """The OpenAPI 3 document of the routes (built at the first call,
        when every route is there)."""
        from verifier.common import openapi

        if self._openapi is None:
            self._openapi = openapi.document_routes(
                [(r.method, r.template, r.handler) for r in self._routes],
                self.title,
                responses=self._responses,
            )
        return self._openapi

    def _serve_openapi(
        self, request: Request, params: Mapping[str, str]
    ) -> tuple[int, Any]:
        """The service's OpenAPI 3 document."""
        return 200, self.document()

    def answer(self, request: Request) -> tuple[bytes, bool]:
        """The whole answer to ``request`` (head and body), and whether the
        connection is kept for another request."""
        request_id, tokens = conventions.new_request_id()
        try:
            status, body, ctype, last = self._dispatch(request)
        finally:
            conventions.reset_request_id(tokens)
        keep = request.keep_alive and not last
        head = self.head(status, len(body), request_id, keep, ctype)
        return (head if request.method == "HEAD" else head + body), keep

    def _dispatch(self, request: Request) -> tuple[int, bytes, str, bool]:
        if request.path == conventions.HEALTHCHECK_PATH and request.method in (
            "GET",
            "HEAD",
        ):
            return 200, b"OK", "text/plain; charset=utf-8", False
        allowed = False
        for route in self._routes:
            match = route.pattern.fullmatch(request.path)
            if match is None:
                continue
            if route.method != request.method:
                allowed = True
                continue
            return self._run(route.handler, request, match.groupdict())
        if allowed:
            data = _error_data(
                "method_not_allowed", f"{request.method} is not allowed here"
            )
            return 405, orjson.dumps(data), _JSON, False
        missing = _error_data("not_found", "no such resource")
        return 404, orjson.dumps(missing), _JSON, False

    @staticmethod
    def _run(
        handler: LeanHandler, request: Request, params: Mapping[str, str]
    ) -> tuple[int, bytes, str, bool]:
        try:
            answer = handler(request, params)
            status, data = answer
            return status, orjson.dumps(data), _JSON, isinstance(answer, LastAnswer)
        except RequestError as exc:
            status, data = exc.status, _error_data(exc.code, exc.detail)
        except MalformedError as exc:  # "bad_field" or "malformed"
            status, data = 400, _error_data(exc.code, str(exc))
        except EnvelopeError as exc:
            status, data = 400, _error_data("envelope", exc.detail)
        except Exception:  # process boundary: log and keep serving
            LOG.exception(
                "unexpected error serving %s %s", request.method, request.path
            )
            status = 500
            data = _error_data("internal", "internal error; see the service log")
        return status, orjson.dumps(data), _JSON, False

    def head(
        self,
        status: int,
        length: int,
        request_id: str,
        keep_alive: bool,
        ctype: str = "application/json",
    ) -> bytes:
        """The status line and fields of an answer."""
        return (
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}\r\n"
            f"Content-Type: {ctype}\r\n"
            f"Content-Length: {length}\r\n"
            f"Date: {self._clock.date()}\r\n"
            f"{conventions.REQUEST_ID_HEADER}: {request_id}\r\n"
            f"{'' if keep_alive else 'Connection: close' + chr(13) + chr(10)}\r\n"
        ).encode("latin-1")

    def refusal(self, exc: BadRequestError) -> bytes:
        """The answer to bytes that are not a request we take (the
        connection is closed after it)."""
        body = orjson.dumps(_error_data(exc.code, exc.detail))
        request_id, tokens = conventions.new_request_id()
        conventions.reset_request_id(tokens)
        return self.head(exc.status, len(body), request_id, False) + body


class _Connection(asyncio.Protocol):
    """One client connection (plain TCP; :class:`_TlsConnection` adds TLS)."""

    __slots__ = (
        "_app",
        "_closing",
        "_limits",
        "_loop",
        "_parser",
        "_paused",
        "_timer",
        "lost",
        "transport",
    )

    def __init__(self, app: LeanApp, limits: tuple[float, float]) -> None:
        self._app = app
        self._loop = asyncio.get_running_loop()
        self._parser = RequestParser(app.max_body, app.too_large)
        self._limits = limits  # (keepalive, request_timeout)
        self.transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._paused = False
        self._closing = False
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(high=_HIGH_WATER)
        # the first request (and the TLS handshake) has this long to arrive
        self._arm(self._limits[1])

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self, seconds: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_later(seconds, self._expire)

    def _expire(self) -> None:
        self._timer = None
        self._closing = True
        self.close()

    def data_received(self, data: bytes) -> None:
        self._data(data)

    def _data(self, data: bytes) -> None:
        """Bytes of requests (plaintext, whatever the transport)."""
        if self._closing:
            return
        idle = not self._parser.pending
        try:
            self._parser.feed(data)
        except BadRequestError as exc:
            self._refuse(exc)
            return
        served = self._serve()
        if self._closing or self._paused:
            return
        if self._parser.pending:
            if idle or served:
                # the first bytes of a request: it has this long to arrive whole
                self._arm(self._limits[1])
        elif served:
            self._arm(self._limits[0])

    def _serve(self) -> int:
        """Answer the complete requests buffered; how many."""
        parser = self._parser
        served = 0
        while not self._paused and not self._closing and not self.lost:
            try:
                request = parser.next_request()
            except BadRequestError as exc:
                self._refuse(exc)
                break
            if request is None:
                if parser.expects_continue:
                    parser.expects_continue = False
                    self._send(b"HTTP/1.1 100 Continue\r\n\r\n")
                break
            answer, keep = self._app.answer(request)
            self._send(answer)
            served += 1
            if not keep:
                self._closing = True
                self.close()
        return served

    def _refuse(self, exc: BadRequestError) -> None:
        LOG.warning("Refused a request: %s: %s", exc.code, exc.detail)
        self._closing = True
        self._send(self._app.refusal(exc))
        # Linger: what the client is still sending is read and dropped for
        # a moment before the close, lest unread bytes make the kernel
        # reset the connection and the client lose the answer (RFC 9112
        # section 9.6).
        self._arm(_LINGER)

    def _send(self, data: bytes) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(data)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def pause_writing(self) -> None:
        # the client does not read its answers: stop reading its requests
        self._paused = True
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self._paused = False
        if self.transport is not None and not self._closing and not self.lost:
            self.transport.resume_reading()
            if self._serve() and not self._parser.pending:
                self._arm(self._limits[0])

    def eof_received(self) -> bool | None:
        return None  # close our side too

    # the TLS side's hooks (TlsBio)
    def _eof(self) -> None:
        self._closing = True

    def _settle(self, exc: BaseException | None) -> None:
        if exc is not None:
            LOG.debug("Connection failed: %s", exc)

    def _end_handshake(self, exc: BaseException | None) -> None:
        if exc is not None:  # a refused client certificate is logged by tls
            LOG.debug("TLS handshake failed: %s", exc)


class _TlsConnection(TlsBio, _Connection, asyncio.BufferedProtocol):
    """One client connection over TLS, run here over memory BIOs with its
    reads in the server's one buffer (:mod:`verifier.common._http_tls`):
    an idle kept-alive connection holds no read buffer of its own."""

    __slots__ = ("_buffer", "_incoming", "_outgoing", "_ready", "_tls")

    def __init__(
        self,
        app: LeanApp,
        limits: tuple[float, float],
        context: ssl.SSLContext,
        buffer: memoryview,
    ) -> None:
        super().__init__(app, limits)
        self._buffer = buffer
        self._incoming, self._outgoing, self._tls = wrap(context, True)
        self._ready = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._step_handshake()

    def eof_received(self) -> bool | None:
        self._tls_eof()
        if self._ready:
            self._read_plaintext()
        return None

    @property
    def _handshaking(self) -> bool:
        return not self._ready

    @property
    def _tls_ready(self) -> bool:
        return self._ready

    def _end_handshake(self, exc: BaseException | None) -> None:
        self._ready = exc is None
        super()._end_handshake(exc)


async def serve(
    app: LeanApp,
    host: str | None,
    port: int,
    tls: ssl.SSLContext | None = None,
    keepalive: float = 75.0,
    request_timeout: float = 30.0,
) -> asyncio.Server:
    """Listen on ``host:port`` (0: any free port) and serve ``app``, over
    TLS with the server context ``tls`` if given.

    Raises:
        OSError: the port cannot be bound.
    """
    loop = asyncio.get_running_loop()
    limits = (keepalive, request_timeout)
    if tls is None:
        return await loop.create_server(
            lambda: _Connection(app, limits), host, port, reuse_address=True
        )
    context = tls
    buffer = memoryview(bytearray(READ_SIZE))  # every connection's reads
    return await loop.create_server(
        lambda: _TlsConnection(app, limits, context, buffer),
        host,
        port,
        reuse_address=True,
    )
