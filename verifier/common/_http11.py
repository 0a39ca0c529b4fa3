"""HTTP/1.1 message framing for the one client (RFC 9112), without I/O.

:func:`request_bytes` writes a request; :class:`ResponseParser` is fed the
bytes of an answer as they arrive (from an asyncio protocol or a blocking
socket: the same parser serves both) and says when the answer is complete.
Every limit is enforced while reading: the header block, the number of
header fields, the body (Content-Length, chunked or read until the
connection closes). Anything that is not a well-formed HTTP/1.x answer
raises :class:`ProtocolError`.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Mapping

__all__ = ["MAX_HEAD", "ProtocolError", "Response", "ResponseParser", "request_bytes"]

MAX_HEAD = 16 * 1024  # status line and header fields
_MAX_FIELDS = 100
_MAX_CHUNK_LINE = 1024
_NO_BODY_STATUS = frozenset({204, 304})
_HEX = re.compile(rb"[0-9A-Fa-f]{1,16}")
_DIGITS = re.compile(r"[0-9]{1,19}")


class ProtocolError(ValueError):
    """The peer's bytes are not an acceptable HTTP/1.x answer."""


@dataclasses.dataclass(frozen=True, slots=True)
class Response:
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


def request_bytes(
    method: str,
    host: str,
    port: int,
    target: str,
    headers: Mapping[str, str],
    body: bytes | None,
) -> bytes:
    """One request, ready to write.

    Args:
        method: the method (upper case).
        host: the ``Host`` field's host.
        port: the ``Host`` field's port.
        target: origin-form target (path and query).
        headers: further fields (``Content-Length`` is added here).
        body: the body, or None.

    Raises:
        ProtocolError: a field or the target contains CR, LF or NUL.
    """
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}:{port}"]
    lines.extend(f"{name}: {value}" for name, value in headers.items())
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    elif method in ("POST", "PUT", "PATCH"):
        lines.append("Content-Length: 0")
    for line in lines:
        if "\r" in line or "\n" in line or "\0" in line:
            raise ProtocolError("a request field contains CR, LF or NUL")
    head = "\r\n".join(lines)
    return head.encode("latin-1") + b"\r\n\r\n" + (body or b"")


class _State(enum.Enum):
    HEAD = 1
    LENGTH = 2
    CHUNK_SIZE = 3
    CHUNK_DATA = 4
    TRAILERS = 5
    UNTIL_CLOSE = 6
    DONE = 7


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
        self._state = _State.HEAD
        self._scan = 0  # where to look for the end of the head next
        self._need = 0  # bytes of body (or chunk) still expected
        self._chunks: list[bytes] = []
        self._size = 0
        self._status = 0
        self._reason = ""
        self._headers: dict[str, str] = {}
        self._reusable = True
        self.received = 0
        self.result: Response | None = None

    @property
    def done(self) -> bool:
        return self._state is _State.DONE

    def feed(self, data: bytes) -> None:
        """Take the next bytes of the answer.

        Raises:
            ProtocolError: malformed, too large, or bytes after the answer.
        """
        if self._state is _State.DONE:
            raise ProtocolError("bytes after the end of the answer")
        self.received += len(data)
        self._buf += data
        pos = 0
        while not self.done:
            step = self._step(pos)
            if step is None:
                break
            pos = step
        del self._buf[:pos]
        self._scan = max(0, self._scan - pos)
        if self.done and self._buf and self.result is not None:
            # stray bytes after the answer: keep it, never reuse the connection
            self.result = dataclasses.replace(self.result, reusable=False)
            self._buf.clear()

    def feed_eof(self) -> None:
        """The peer closed the connection.

        Raises:
            ProtocolError: the answer was not complete.
        """
        if self._state is _State.UNTIL_CLOSE:
            self._finish(bytes(self._buf))
            self._buf.clear()
        elif self._state is not _State.DONE:
            raise ProtocolError(
                "connection closed before a complete answer"
                if self.received
                else "connection closed without an answer"
            )

    def _step(self, pos: int) -> int | None:
        """Advance by one element from ``pos``; None when more bytes are needed."""
        buf = self._buf
        state = self._state
        if state is _State.HEAD:
            return self._head(pos)
        if state is _State.LENGTH:
            if len(buf) - pos < self._need:
                return None
            self._finish(bytes(buf[pos : pos + self._need]))
            return pos + self._need
        if state is _State.CHUNK_SIZE:
            return self._chunk_size(pos)
        if state is _State.CHUNK_DATA:
            if len(buf) - pos < self._need + 2:
                return None
            if buf[pos + self._need : pos + self._need + 2] != b"\r\n":
                raise ProtocolError("chunk not followed by CRLF")
            self._chunks.append(bytes(buf[pos : pos + self._need]))
            self._state = _State.CHUNK_SIZE
            return pos + self._need + 2
        if state is _State.TRAILERS:
            return self._trailer(pos)
        # UNTIL_CLOSE: keep everything until feed_eof, within the limit
        if len(buf) - pos > self._max_body:
            raise ProtocolError(f"answer larger than {self._max_body} bytes")
        return None

    def _head(self, pos: int) -> int | None:
        end = self._buf.find(b"\r\n\r\n", max(pos, self._scan))
        if end < 0:
            if len(self._buf) - pos > MAX_HEAD:
                raise ProtocolError("answer header block too large")
            self._scan = max(pos, len(self._buf) - 3)
            return None
        if end - pos > MAX_HEAD:
            raise ProtocolError("answer header block too large")
        self._parse_head(bytes(self._buf[pos:end]))
        self._scan = 0
        return end + 4

    def _parse_head(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        if len(lines) > _MAX_FIELDS + 1:
            raise ProtocolError("too many header fields")
        version, _, rest = lines[0].partition(" ")
        code, _, reason = rest.partition(" ")
        if version not in ("HTTP/1.1", "HTTP/1.0"):
            raise ProtocolError("not an HTTP/1.x answer")
        if len(code) != 3 or not code.isdigit() or not 100 <= int(code) <= 599:
            raise ProtocolError(f"bad status code {code[:10]!r}")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not colon or not name or name != name.strip() or "\0" in line:
                raise ProtocolError("malformed header field")
            key = name.lower()
            value = value.strip(" \t")
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        status = int(code)
        if status < 200:  # 1xx: an interim answer; the real one follows
            return
        self._status, self._reason, self._headers = status, reason, headers
        self._reusable = version == "HTTP/1.1" and not _has_token(
            headers.get("connection", ""), "close"
        )
        self._framing(headers)

    def _framing(self, headers: Mapping[str, str]) -> None:
        coding = headers.get("transfer-encoding")
        length = headers.get("content-length")
        if self._head_request or self._status in _NO_BODY_STATUS:
            self._finish(b"")
        elif coding is not None:
            if length is not None:
                raise ProtocolError("both Transfer-Encoding and Content-Length")
            if coding.strip().lower() != "chunked":
                raise ProtocolError(f"unsupported Transfer-Encoding {coding[:40]!r}")
            self._state = _State.CHUNK_SIZE
        elif length is not None:
            values = {v.strip() for v in length.split(",")}
            if len(values) != 1 or not _DIGITS.fullmatch(value := values.pop()):
                raise ProtocolError("bad Content-Length")
            self._need = int(value)
            if self._need > self._max_body:
                raise ProtocolError(f"answer larger than {self._max_body} bytes")
            self._state = _State.LENGTH
        else:
            self._reusable = False
            self._state = _State.UNTIL_CLOSE

    def _chunk_size(self, pos: int) -> int | None:
        end = self._buf.find(b"\r\n", pos)
        if end < 0:
            if len(self._buf) - pos > _MAX_CHUNK_LINE:
                raise ProtocolError("chunk size line too long")
            return None
        digits = bytes(self._buf[pos:end]).split(b";", 1)[0].strip(b" \t")
        if not _HEX.fullmatch(digits):
            raise ProtocolError("bad chunk size")
        size = int(digits, 16)
        self._size += size
        if self._size > self._max_body:
            raise ProtocolError(f"answer larger than {self._max_body} bytes")
        self._need = size
        self._state = _State.CHUNK_DATA if size else _State.TRAILERS
        return end + 2

    def _trailer(self, pos: int) -> int | None:
        end = self._buf.find(b"\r\n", pos)
        if end < 0:
            if len(self._buf) - pos > MAX_HEAD:
                raise ProtocolError("trailer too large")
            return None
        if end == pos:  # the empty line ending the answer
            self._finish(b"".join(self._chunks))
        return end + 2

    def _finish(self, body: bytes) -> None:
        if len(body) > self._max_body:
            raise ProtocolError(f"answer larger than {self._max_body} bytes")
        self.result = Response(
            self._status, self._reason, self._headers, body, self._reusable
        )
        self._state = _State.DONE


def _has_token(value: str, token: str) -> bool:
    return any(part.strip().lower() == token for part in value.split(","))
