"""HTTP/1.1 message framing for the one client (RFC 9112), without I/O.

:func:`request_bytes` writes a request; :class:`ResponseParser` is fed the
bytes of an answer as they arrive (from an asyncio protocol or a blocking
socket: the same parser serves both) and says when the answer is complete.
Every limit is enforced while reading: the header block, the number of
header fields, the body (Content-Length, chunked or read until the
connection closes). Anything that is not a well-formed HTTP/1.x answer
raises :class:`HttpFramingError`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple
from urllib.parse import urlencode, urlsplit

from verifier.common.errors import CommonError

__all__ = [
    "MAX_HEAD",
    "Origin",
    "HttpFramingError",
    "Response",
    "ResponseParser",
    "authority",
    "origin",
    "query",
    "request_bytes",
    "split_url",
]

MAX_HEAD = 16 * 1024  # status line and header fields
_MAX_FIELDS = 100
_MAX_CHUNK_LINE = 1024
_NO_BODY_STATUS = frozenset({204, 304})
_URL = re.compile(r"(https?://[^/?#]*)(.*)", re.IGNORECASE | re.DOTALL)
_SAFE = re.compile(r"[A-Za-z0-9_.~-]*")
_NO_FIELDS: Mapping[str, str] = MappingProxyType({})
_HEX = re.compile(rb"[0-9A-Fa-f]{1,16}")


class HttpFramingError(CommonError):
    """The peer's bytes are not an acceptable HTTP/1.x answer (or a request
    field would break the framing of ours)."""


class Response(NamedTuple):
    """A complete answer.

    Attributes:
        status: the status code.
        reason: the reason phrase.
        headers: field names lower-cased; repeated fields joined by ``, ``.
        body: the decoded (de-chunked) body.
        reusable: the connection may carry another request.
    """

    status: int
    reason: str
    headers: Mapping[str, str]
    body: bytes
    reusable: bool


@dataclasses.dataclass(frozen=True, slots=True)
class Origin:
    """Where requests go: scheme, host and port (RFC 9110 section 4.3.1)."""

    scheme: str
    host: str
    port: int
    authority: str  # the Host field

    @property
    def tls(self) -> bool:
        return self.scheme == "https"


def origin(head: str) -> Origin:
    """The origin ``scheme://host[:port]``.

    Raises:
        ValueError: not an http:// or https:// origin with a host.
    """
    parts = urlsplit(head)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s)://host URL: {head[:200]!r}")
    if parts.username is not None or parts.password is not None:
        raise ValueError("credentials in a URL are not accepted")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return Origin(parts.scheme, parts.hostname, port, authority(parts.hostname, port))


def split_url(url: str) -> tuple[str, str]:
    """(origin, target) of an absolute URL: ``https://h:1`` and ``/p?q``
    (a fragment dropped).

    Raises:
        ValueError: not an absolute http(s) URL.
    """
    match = _URL.match(url)
    if match is None:
        raise ValueError(f"not an http(s)://host URL: {url[:200]!r}")
    head, tail = match.groups()
    tail = tail.partition("#")[0]
    return head, tail if tail.startswith("/") else "/" + tail


def query(params: Mapping[str, str]) -> str:
    """``urlencode(params)``, faster when nothing needs quoting."""
    safe = _SAFE.fullmatch
    return "&".join(
        f"{k}={v}" if safe(k) and safe(v) else urlencode({k: v})
        for k, v in params.items()
    )


def authority(host: str, port: int) -> str:
    """The ``Host`` field's value for ``host`` and ``port``."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def request_bytes(
    method: str,
    host: str,
    target: str,
    headers: Mapping[str, str],
    body: bytes | None,
) -> bytes:
    """One request, ready to write.

    Args:
        method: the method (upper case).
        host: the ``Host`` field's value (see :func:`authority`).
        target: origin-form target (path and query).
        headers: further fields (``Content-Length`` is added here).
        body: the body, or None.

    Raises:
        HttpFramingError: a field contains CR, LF or NUL, or the target a
            space.
    """
    fields = "".join([f"{name}: {value}\r\n" for name, value in headers.items()])
    lines = 2 + len(headers)
    if body is not None:
        fields += f"Content-Length: {len(body)}\r\n"
        lines += 1
    elif method in ("POST", "PUT", "PATCH"):
        fields += "Content-Length: 0\r\n"
        lines += 1
    head = f"{method} {target} HTTP/1.1\r\nHost: {host}\r\n{fields}\r\n"
    # a CR, LF or NUL in any part would split or end the head early
    if (
        head.count("\n") != lines + 1
        or head.count("\r") != lines + 1
        or "\0" in head
        or " " in target
    ):
        raise HttpFramingError("a request field contains CR, LF, NUL or a space")
    return head.encode("latin-1") + (body or b"")


# reader states (plain ints: enum member access costs on this hot path)
_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _TRAILERS, _UNTIL_CLOSE, _DONE = range(7)


class ResponseParser:
    """Reads one answer from bytes fed to it.

    Args:
        max_body: the largest body accepted (bytes).
        head_request: the request was HEAD (the answer has no body).
    """

    def __init__(self, max_body: int, head_request: bool = False) -> None:
        self._max_body = max_body
        self._head_request = head_request
        self._buf = bytearray()
        self._state = _HEAD
        self._scan = 0  # where to look for the end of the head next
        self._need = 0  # bytes of body (or chunk) still expected
        self._chunks: list[bytes] | None = None  # made for a chunked body
        self._size = 0
        self._status = 0
        self._reason = ""
        self._headers: Mapping[str, str] = _NO_FIELDS
        self._reusable = True
        self.received = 0
        self.result: Response | None = None

    @property
    def done(self) -> bool:
        return self._state == _DONE

    def feed(self, data: bytes) -> None:
        """Take the next bytes of the answer.

        Raises:
            HttpFramingError: malformed, too large, or bytes after the answer.
        """
        state = self._state
        if state == _DONE:
            raise HttpFramingError("bytes after the end of the answer")
        self.received += len(data)
        if state == _HEAD and not self._buf:
            # the usual case: the whole head in one read
            end = data.find(b"\r\n\r\n", 0, MAX_HEAD + 4)
            if end >= 0:
                self._parse_head(data[:end])
                data = data[end + 4 :]
                state = self._state
        if state == _LENGTH:
            self._body(data)
            return
        self._buf += data
        pos = 0
        while self._state != _DONE:
            step = self._step(pos)
            if step is None:
                break
            pos = step
        del self._buf[:pos]
        self._scan = max(0, self._scan - pos)
        if self._state == _DONE and self._buf and self.result is not None:
            # stray bytes after the answer: keep it, never reuse the connection
            self.result = self.result._replace(reusable=False)
            self._buf.clear()

    def _body(self, data: bytes) -> None:
        """Take bytes of a Content-Length body."""
        need, buf = self._need, self._buf
        if not buf and len(data) >= need:
            body, extra = (data, False) if len(data) == need else (data[:need], True)
        else:
            buf += data
            if len(buf) < need:
                return
            body, extra = bytes(buf[:need]), len(buf) > need
            buf.clear()
        self._finish(body)
        if extra and self.result is not None:
            # stray bytes after the answer: keep it, never reuse the connection
            self.result = self.result._replace(reusable=False)

    def feed_eof(self) -> None:
        """The peer closed the connection.

        Raises:
            HttpFramingError: the answer was not complete.
        """
        if self._state == _UNTIL_CLOSE:
            self._finish(bytes(self._buf))
            self._buf.clear()
        elif self._state != _DONE:
            raise HttpFramingError(
                "connection closed before a complete answer"
                if self.received
                else "connection closed without an answer"
            )

    def _step(self, pos: int) -> int | None:
        """Advance by one element from ``pos``; None when more bytes are needed."""
        buf = self._buf
        state = self._state
        if state == _HEAD:
            return self._head(pos)
        if state == _LENGTH:
            if len(buf) - pos < self._need:
                return None
            self._finish(bytes(buf[pos : pos + self._need]))
            return pos + self._need
        if state == _CHUNK_SIZE:
            return self._chunk_size(pos)
        if state == _CHUNK_DATA:
            if len(buf) - pos < self._need + 2:
                return None
            if buf[pos + self._need : pos + self._need + 2] != b"\r\n":
                raise HttpFramingError("chunk not followed by CRLF")
            assert self._chunks is not None
            self._chunks.append(bytes(buf[pos : pos + self._need]))
            self._state = _CHUNK_SIZE
            return pos + self._need + 2
        if state == _TRAILERS:
            return self._trailer(pos)
        # UNTIL_CLOSE: keep everything until feed_eof, within the limit
        if len(buf) - pos > self._max_body:
            raise HttpFramingError(f"answer larger than {self._max_body} bytes")
        return None

    def _head(self, pos: int) -> int | None:
        end = self._buf.find(b"\r\n\r\n", max(pos, self._scan))
        if end < 0:
            if len(self._buf) - pos > MAX_HEAD:
                raise HttpFramingError("answer header block too large")
            self._scan = max(pos, len(self._buf) - 3)
            return None
        if end - pos > MAX_HEAD:
            raise HttpFramingError("answer header block too large")
        self._parse_head(bytes(self._buf[pos:end]))
        self._scan = 0
        return end + 4

    def _parse_head(self, head: bytes) -> None:
        text = head.decode("latin-1")
        if "\0" in text or text.count("\r\n") > _MAX_FIELDS:
            raise HttpFramingError("malformed or too many header fields")
        status_line, _, fields = text.partition("\r\n")
        version, _, rest = status_line.partition(" ")
        code, _, reason = rest.partition(" ")
        if version != "HTTP/1.1" and version != "HTTP/1.0":
            raise HttpFramingError("not an HTTP/1.x answer")
        if not (len(code) == 3 and code.isascii() and code.isdigit()) or not (
            "100" <= code <= "599"
        ):
            raise HttpFramingError(f"bad status code {code[:10]!r}")
        headers: dict[str, str] = {}
        for line in fields.split("\r\n") if fields else ():
            name, colon, value = line.partition(":")
            if not colon or not name or name[0] in " \t" or name[-1] in " \t":
                raise HttpFramingError("malformed header field")
            key = name.lower()
            value = value.strip(" \t")
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        status = int(code)
        if status < 200:  # 1xx: an interim answer; the real one follows
            return
        self._status, self._reason, self._headers = status, reason, headers
        connection = headers.get("connection")
        self._reusable = version == "HTTP/1.1" and (
            connection is None or not _has_token(connection, "close")
        )
        self._framing(headers)

    def _framing(self, headers: Mapping[str, str]) -> None:
        coding = headers.get("transfer-encoding")
        length = headers.get("content-length")
        if self._head_request or self._status in _NO_BODY_STATUS:
            self._finish(b"")
        elif coding is not None:
            if length is not None:
                raise HttpFramingError("both Transfer-Encoding and Content-Length")
            if coding.strip().lower() != "chunked":
                raise HttpFramingError(f"unsupported Transfer-Encoding {coding[:40]!r}")
            self._state = _CHUNK_SIZE
            self._chunks = []
        elif length is not None:
            if "," in length:  # repeated: acceptable only if all equal
                values = {v.strip() for v in length.split(",")}
                length = values.pop() if len(values) == 1 else ""
            if not (length.isascii() and length.isdigit() and len(length) < 19):
                raise HttpFramingError("bad Content-Length")
            self._need = int(length)
            if self._need > self._max_body:
                raise HttpFramingError(f"answer larger than {self._max_body} bytes")
            self._state = _LENGTH
        else:
            self._reusable = False
            self._state = _UNTIL_CLOSE

    def _chunk_size(self, pos: int) -> int | None:
        end = self._buf.find(b"\r\n", pos)
        if end < 0:
            if len(self._buf) - pos > _MAX_CHUNK_LINE:
                raise HttpFramingError("chunk size line too long")
            return None
        digits = bytes(self._buf[pos:end]).split(b";", 1)[0].strip(b" \t")
        if not _HEX.fullmatch(digits):
            raise HttpFramingError("bad chunk size")
        size = int(digits, 16)
        self._size += size
        if self._size > self._max_body:
            raise HttpFramingError(f"answer larger than {self._max_body} bytes")
        self._need = size
        self._state = _CHUNK_DATA if size else _TRAILERS
        return end + 2

    def _trailer(self, pos: int) -> int | None:
        end = self._buf.find(b"\r\n", pos)
        if end < 0:
            if len(self._buf) - pos > MAX_HEAD:
                raise HttpFramingError("trailer too large")
            return None
        if end == pos:  # the empty line ending the answer
            self._finish(b"".join(self._chunks or ()))
        return end + 2

    def _finish(self, body: bytes) -> None:
        if len(body) > self._max_body:
            raise HttpFramingError(f"answer larger than {self._max_body} bytes")
        self.result = Response(
            self._status, self._reason, self._headers, body, self._reusable
        )
        self._state = _DONE


def _has_token(value: str, token: str) -> bool:
    return any(part.strip().lower() == token for part in value.split(","))
