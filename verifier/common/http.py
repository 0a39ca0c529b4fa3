"""The one HTTP client of the project (STYLE rule 13).

Every outgoing HTTP call of the services, the agent, the tenant tools, the
revocation hooks and the vTPM manager goes through this module. Both
clients frame requests and answers with the same HTTP/1.1 code
(:mod:`verifier.common._http11`, without I/O) and turn answers into the
same :class:`Answer`:

- :class:`AsyncClient` keeps connections alive per peer (the quote loop
  sends one small request per node per round over a kept-alive mTLS
  connection: a general client spends more CPU per request than the
  signature check itself) and checks a pinned peer certificate right after
  the handshake;
- :class:`BlockingClient` makes one connection per call with the
  :mod:`socket` and :mod:`ssl` modules, for synchronous callers (a hook
  action in a worker thread, the autosign executable, the vTPM manager in
  a libvirt hook, the outbox). It works whether or not an event loop runs
  in the calling thread, which ``asyncio.run`` of the async client would
  not.

Each public ``request`` wraps a private ``_request`` and turns any failure
-- refused connection, TLS failure, a certificate that is not the pinned
one, timeout, an answer that is not HTTP, is too large, or is not JSON
when JSON was expected -- into :class:`~verifier.common.errors.TransportError`.
An answer with a 4xx or 5xx status is not a failure of the transport: it is
returned, with its JSON error body (``{"error": {"code", "message"}}``)
parsed into :attr:`Answer.error`, for the caller to map to its own errors.
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import ssl
import time
from collections.abc import Mapping
from types import TracebackType
from typing import Any, ClassVar

import orjson

from verifier.common import _http11
from verifier.common._http11 import HttpFramingError, Origin, Response, ResponseParser
from verifier.common._http_pool import Pool
from verifier.common.errors import TransportError
from verifier.common.tls import PinMismatchError, check_pin, refusal_hint

__all__ = [
    "MAX_ANSWER",
    "Answer",
    "AsyncClient",
    "BlockingClient",
    "Refusal",
]

MAX_ANSWER = 8 * 1024 * 1024  # an IMA list part (4 MiB) and a firmware log
_IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
_READ_SIZE = 256 * 1024
_MAX_ORIGINS = 100_000  # origins remembered per client (one per peer)


@dataclasses.dataclass(frozen=True, slots=True)
class Refusal:
    """What a refusal says, read leniently from whatever the peer answered
    (the checked wire form is
    :class:`verifier.protocol.messages.errors.ErrorBody`).

    Attributes:
        code: the stable error code of our JSON error body, if any.
        message: its message, else the start of the body or the reason.
    """

    code: str | None
    message: str


@dataclasses.dataclass(frozen=True, slots=True)
class Answer:
    """An HTTP answer of any status.

    Attributes:
        status: the HTTP status.
        headers: field names lower-cased.
        body: the raw body.
        data: the parsed JSON body: of a 2xx answer when JSON was expected
            (None if the body was empty), of another answer when it is JSON.
    """

    status: int
    headers: Mapping[str, str]
    body: bytes
    data: Any = None

    @property
    def ok(self) -> bool:
        """A 2xx answer."""
        return 200 <= self.status < 300

    def text(self, limit: int = 300) -> str:
        """The start of the body as text, for messages."""
        return self.body[:limit].decode("utf-8", "replace").strip()

    @property
    def error(self) -> Refusal:
        """The code and message of a refusal (our JSON error body, or the
        start of whatever the peer sent)."""
        err = self.data.get("error") if isinstance(self.data, dict) else None
        if isinstance(err, dict):
            code = err.get("code")
            message = err.get("message")
            return Refusal(
                str(code) if code is not None else None,
                str(message) if message is not None else str(err)[:300],
            )
        return Refusal(None, self.text() or f"HTTP {self.status}")


@dataclasses.dataclass(slots=True)
class _Prepared:
    """A request ready to send (see :meth:`_ClientBase._prepare`)."""

    method: str
    origin: Origin
    data: bytes
    pin: bytes | None
    expect_json: bool
    max_answer: int


def _describe(exc: BaseException) -> str:
    """A short reason for a failed exchange."""
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"TLS certificate not accepted ({exc.reason}: {exc.verify_message})"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, (ValueError, HttpFramingError, PinMismatchError)):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


class _ClientBase:
    """What both clients share: configuration, request and answer building.

    Args:
        context: TLS client context for https:// URLs (None: the system's
            CAs, without a client certificate). With ``pin`` requests it
            may skip certificate verification (see
            :func:`verifier.common.tls.pinning_client_context`).
        timeout: seconds for one whole exchange, connection included.
        max_answer: the largest answer body accepted (bytes).
    """

    _EXTRA_FIELDS: ClassVar[Mapping[str, str]] = {}

    def __init__(
        self,
        context: ssl.SSLContext | None = None,
        timeout: float = 10.0,
        max_answer: int = MAX_ANSWER,
    ) -> None:
        self._context = context
        self.timeout = timeout
        self._max_answer = max_answer
        self._origins: dict[str, Origin] = {}
        # header fields of every request (never mutated: copied to add some)
        self._fields: Mapping[str, str] = dict(self._EXTRA_FIELDS)
        self._json_fields: Mapping[str, str] = {
            **self._EXTRA_FIELDS,
            "Accept": "application/json",
        }

    def _target(self, url: str, params: Mapping[str, str] | None) -> tuple[Origin, str]:
        """Origin and request target of ``url`` with ``params`` added.

        Raises:
            ValueError: not an absolute http(s) URL.
        """
        head, target = _http11.split_url(url)
        origin = self._origins.get(head)
        if origin is None:
            origin = _http11.origin(head)
            if len(self._origins) >= _MAX_ORIGINS:
                self._origins.clear()
            self._origins[head] = origin
        if params:
            target += ("&" if "?" in target else "?") + _http11.query(params)
        return origin, target

    def _tls_context(self) -> ssl.SSLContext:
        if self._context is None:
            self._context = ssl.create_default_context()
        return self._context

    def _prepare(
        self,
        method: str,
        url: str,
        params: Mapping[str, str] | None,
        json: Any,
        content: bytes | None,
        headers: Mapping[str, str] | None,
        pin: bytes | None,
        expect_json: bool,
        max_answer: int | None,
    ) -> _Prepared:
        origin, target = self._target(url, params)
        if pin is not None and not origin.tls:
            raise ValueError("a pinned peer needs an https:// URL")
        fields = self._json_fields if expect_json else self._fields
        body = content
        if json is not None:
            if content is not None:
                raise ValueError("a request has a JSON body or content, not both")
            body = orjson.dumps(json)
            fields = {**fields, "Content-Type": "application/json"}
        if headers:
            fields = {**fields, **headers}
        data = _http11.request_bytes(method, origin.authority, target, fields, body)
        limit = self._max_answer if max_answer is None else max_answer
        return _Prepared(method, origin, data, pin, expect_json, limit)

    @staticmethod
    def _answer(prepared: _Prepared, response: Response) -> Answer:
        """The answer, its JSON body parsed.

        Raises:
            ValueError: a 2xx body that is not JSON when JSON was expected.
        """
        body = response.body
        data = None
        if body and 200 <= response.status < 300:
            if prepared.expect_json:
                try:
                    data = orjson.loads(body)
                except orjson.JSONDecodeError:
                    raise ValueError("the answer is not JSON") from None
        elif body[:1] in (b"{", b"["):
            try:
                data = orjson.loads(body)
            except orjson.JSONDecodeError:
                data = None
        return Answer(response.status, response.headers, body, data)

    def _failure(self, method: str, url: str, exc: BaseException) -> TransportError:
        where = url.split("?", 1)[0][:200]
        reason = _describe(exc)
        hint = refusal_hint(self._context, exc) if url.startswith("https:") else ""
        if hint:  # TLS 1.3: a refused certificate shows as a reset or an alert
            reason = f"{hint} ({reason})"
        return TransportError(f"{method} {where}: {reason}")


class AsyncClient(_ClientBase):
    """HTTP/1.1 over kept-alive connections, for asyncio callers.

    Args:
        context: see :class:`_ClientBase`.
        timeout: seconds for one whole exchange, connection included.
        max_answer: the largest answer body accepted (bytes).
        max_idle: idle connections kept per peer.
        idle_timeout: seconds an idle connection is kept (below the 75 s
            after which aiohttp servers close them).
    """

    def __init__(
        self,
        context: ssl.SSLContext | None = None,
        timeout: float = 10.0,
        max_answer: int = MAX_ANSWER,
        max_idle: int = 4,
        idle_timeout: float = 30.0,
    ) -> None:
        super().__init__(context, timeout, max_answer)
        self._pool = Pool(max_idle, idle_timeout)

    async def request(
        self,
        method: str,
        url: str,
        *,
        params: Mapping[str, str] | None = None,
        json: Any = None,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        pin: bytes | None = None,
        expect_json: bool = True,
        max_answer: int | None = None,
    ) -> Answer:
        """One exchange; the answer whatever its status.

        Args:
            method: the HTTP method.
            url: absolute http:// or https:// URL.
            params: query parameters added to the URL's.
            json: sent as the JSON body when not None.
            content: a raw body (give its Content-Type in ``headers``).
            headers: further request header fields.
            pin: DER of the only peer certificate accepted (https only),
                compared right after the handshake, before the request.
            expect_json: a 2xx answer with a body must be JSON.
            max_answer: this call's answer size limit.

        Raises:
            TransportError: no usable answer (see the module docstring).
        """
        try:
            return await self._request(
                self._prepare(
                    method,
                    url,
                    params,
                    json,
                    content,
                    headers,
                    pin,
                    expect_json,
                    max_answer,
                )
            )
        except TransportError:
            raise
        except Exception as exc:  # the one client: any failure is the transport's
            raise self._failure(method, url, exc) from exc

    async def _request(self, prepared: _Prepared) -> Answer:
        origin = prepared.origin
        async with asyncio.timeout(self.timeout):
            for attempt in (1, 2):
                conn = self._pool.take(origin, prepared.pin)
                reused = conn is not None
                if conn is None:
                    context = self._tls_context() if origin.tls else None
                    conn = await self._pool.connect(origin, context, prepared.pin)
                parser = ResponseParser(prepared.max_answer, prepared.method == "HEAD")
                response = None
                try:
                    response = await conn.exchange(prepared.data, parser)
                except (ConnectionError, HttpFramingError):
                    # a kept-alive connection the peer closed meanwhile: nothing
                    # was answered, so an idempotent request is sent once more
                    if (
                        attempt == 1
                        and reused
                        and parser.received == 0
                        and prepared.method in _IDEMPOTENT
                    ):
                        continue
                    raise
                finally:
                    if response is not None and response.reusable:
                        self._pool.put(origin, conn)
                    else:
                        conn.close()
                return self._answer(prepared, response)
        raise AssertionError("unreachable: the second attempt returns or raises")

    def forget(self, url: str) -> None:
        """Close the idle connections to the origin of ``url`` (a peer we
        stop talking to)."""
        try:
            origin, _ = self._target(url, None)
        except ValueError:
            return
        self._pool.forget(origin)

    async def close(self) -> None:
        """Close every idle connection (connections in use are closed when
        their exchange ends)."""
        self._pool.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class BlockingClient(_ClientBase):
    """HTTP/1.1 for synchronous callers, one connection per call.

    Args:
        context: see :class:`_ClientBase`.
        timeout: seconds for one whole exchange, connection included.
        max_answer: the largest answer body accepted (bytes).
    """

    _EXTRA_FIELDS: ClassVar[Mapping[str, str]] = {"Connection": "close"}

    def request(
        self,
        method: str,
        url: str,
        *,
        params: Mapping[str, str] | None = None,
        json: Any = None,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        pin: bytes | None = None,
        expect_json: bool = True,
        max_answer: int | None = None,
    ) -> Answer:
        """One exchange; the answer whatever its status (arguments as in
        :meth:`AsyncClient.request`).

        Raises:
            TransportError: no usable answer (see the module docstring).
        """
        try:
            prepared = self._prepare(
                method,
                url,
                params,
                json,
                content,
                headers,
                pin,
                expect_json,
                max_answer,
            )
            return self._request(prepared)
        except TransportError:
            raise
        except Exception as exc:  # the one client: any failure is the transport's
            raise self._failure(method, url, exc) from exc

    def _request(self, prepared: _Prepared) -> Answer:
        deadline = time.monotonic() + self.timeout

        def remaining() -> float:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("timed out")
            return left

        origin = prepared.origin
        parser = ResponseParser(prepared.max_answer, prepared.method == "HEAD")
        with socket.create_connection(
            (origin.host, origin.port), timeout=remaining()
        ) as raw:
            sock: socket.socket = raw
            if origin.tls:
                raw.settimeout(remaining())
                tls = self._tls_context().wrap_socket(
                    raw, server_hostname=origin.host, suppress_ragged_eofs=False
                )
                if prepared.pin is not None:
                    check_pin(tls, prepared.pin)
                sock = tls
            try:
                sock.settimeout(remaining())
                sock.sendall(prepared.data)
                while not parser.done:
                    sock.settimeout(remaining())
                    chunk = sock.recv(_READ_SIZE)
                    if not chunk:
                        parser.feed_eof()
                        break
                    parser.feed(chunk)
            finally:
                sock.close()
        assert parser.result is not None
        return self._answer(prepared, parser.result)
