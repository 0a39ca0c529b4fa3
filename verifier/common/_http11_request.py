"""HTTP/1.1 request framing for the lean server (RFC 9112), without I/O.

:class:`RequestParser` is fed the bytes of a connection as they arrive and
hands out each complete request in turn (pipelined requests included).
It is strict where leniency lets two parsers read one message two ways
(request smuggling): lines end in CRLF only, no whitespace before a
field's colon, no obsolete line folding, one Content-Length, no
Transfer-Encoding (a body must come with its length), ``Host`` required
in HTTP/1.1. Every limit is enforced while reading: the request line, the
head, the number of fields and the body. Anything else raises
:class:`BadRequestError` with the status, code and message to answer with;
the connection is then closed (its framing can no longer be trusted).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import NamedTuple

from verifier.common.errors import RequestError

__all__ = ["MAX_LINE", "BadRequestError", "Request", "RequestParser"]

#: The longest request line (method, target, version) taken, in bytes.
MAX_LINE = 8190
#: The longest head (request line and header fields) taken, in bytes.
MAX_HEAD = 16 * 1024
_MAX_FIELDS = 100
_METHOD = re.compile(rb"[A-Z]{1,16}")
# origin-form: an absolute path and an optional query, visible ASCII only
_TARGET = re.compile(rb"/[\x21-\x7e]*")
_NAME = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# a field value: visible ASCII, obs-text, spaces and tabs inside
_VALUE = re.compile(rb"[\x21-\x7e\x80-\xff]+(?:[ \t]+[\x21-\x7e\x80-\xff]+)*|")
_DIGITS = re.compile(rb"[0-9]{1,12}")


class BadRequestError(RequestError):
    """The bytes are not a request we take: answer ``status`` with the
    JSON error body and close the connection."""


class Request(NamedTuple):
    """A complete request.

    Attributes:
        method: the method (upper case).
        path: the target's path (before any ``?``).
        query: the target's query (after ``?``; empty if none).
        headers: field names lower-cased; repeated fields joined by ``, ``.
        body: the body (empty if none).
        keep_alive: the connection may carry another request.
    """

    method: str
    path: str
    query: str
    headers: Mapping[str, str]
    body: bytes
    keep_alive: bool


def _line_too_long() -> BadRequestError:
    # the words of every other server (verifier.common.web_runner)
    return BadRequestError(
        "line_too_long",
        f"the request line (method and URL) or a header exceeds {MAX_LINE} bytes",
    )


def _field_lines(lines: list[bytes]) -> dict[str, str]:
    if len(lines) > _MAX_FIELDS:
        raise BadRequestError(
            "bad_header", f"more than {_MAX_FIELDS} header fields", 431
        )
    fields: dict[str, str] = {}
    for line in lines:
        name, colon, value = line.partition(b":")
        if not colon or not _NAME.fullmatch(name):
            # also a field folded onto the next line (obs-fold) or a
            # space before the colon (RFC 9112 section 5.1)
            raise BadRequestError("bad_header", "a header field is not valid HTTP/1.1")
        value = value.strip(b" \t")
        if not _VALUE.fullmatch(value):
            raise BadRequestError("bad_header", "a header field is not valid HTTP/1.1")
        key = name.decode("ascii").lower()
        text = value.decode("latin-1")
        fields[key] = f"{fields[key]}, {text}" if key in fields else text
    return fields


def _has_token(value: str, token: str) -> bool:
    return any(part.strip().lower() == token for part in value.split(","))


class RequestParser:
    """Reads the requests of one connection.

    Args:
        max_body: the largest body accepted (bytes); a larger
            Content-Length is refused as soon as the head is read.
        too_large: the code and message of that refusal (413).
    """

    def __init__(
        self,
        max_body: int,
        too_large: tuple[str, str] = ("too_large", "request body is too large"),
    ) -> None:
        self._max_body = max_body
        self._too_large = too_large
        self._buf = bytearray()
        self._head: tuple[str, str, str, dict[str, str], bool] | None = None
        self._need = 0
        #: the request whose head is read asks for ``100 Continue``
        self.expects_continue = False

    @property
    def pending(self) -> bool:
        """Part of a request has arrived and not the rest."""
        return bool(self._buf) or self._head is not None

    def feed(self, data: bytes) -> None:
        """Take the next bytes of the connection (kept until asked for).

        Raises:
            BadRequestError: more is buffered than one request may be.
        """
        self._buf += data
        if self._head is None and len(self._buf) > MAX_HEAD + 4:
            self._find_head()  # refuses a head too long before buffering more

    def next_request(self) -> Request | None:
        """The next complete request, or None until more bytes come.

        Raises:
            BadRequestError: the bytes are not a request we take.
        """
        if self._head is None and not self._find_head():
            return None
        assert self._head is not None
        if len(self._buf) < self._need:
            return None
        method, path, query, fields, keep = self._head
        buf = self._buf
        if len(buf) == self._need:  # the usual case: nothing pipelined behind
            body = bytes(buf)
            self._buf = bytearray()  # a large body's memory goes with it
        else:
            body = bytes(memoryview(buf)[: self._need])
            del buf[: self._need]
        self._head = None
        self.expects_continue = False
        return Request(method, path, query, fields, body, keep)

    def _find_head(self) -> bool:
        buf = self._buf
        # tolerate the empty lines a client may send between requests
        # (RFC 9112 section 2.2): at most a few, then it must be a request
        start = 0
        while buf.startswith(b"\r\n", start) and start < 8:
            start += 2
        end = buf.find(b"\r\n\r\n", start, start + MAX_HEAD + 4)
        if end < 0:
            # the line being received: too long already?
            newline = buf.rfind(b"\r\n", start)
            last = newline + 2 if newline >= 0 else start
            if len(buf) - last > MAX_LINE:
                raise _line_too_long()
            if len(buf) - start > MAX_HEAD + 4:
                raise BadRequestError(
                    "head_too_large", f"the request head exceeds {MAX_HEAD} bytes", 431
                )
            return False
        head = bytes(buf[start:end])
        del buf[: end + 4]
        self._parse_head(head)
        return True

    def _parse_head(self, head: bytes) -> None:
        if b"\r" in head.replace(b"\r\n", b"") or b"\n" in head.replace(b"\r\n", b""):
            raise BadRequestError("bad_request", "a line does not end in CRLF")
        lines = head.split(b"\r\n")
        if max(map(len, lines)) > MAX_LINE:
            raise _line_too_long()
        line = lines[0]
        parts = line.split(b" ")
        if (
            len(parts) != 3
            or not _METHOD.fullmatch(parts[0])
            or parts[2] not in (b"HTTP/1.1", b"HTTP/1.0")
        ):
            raise BadRequestError(
                "bad_request_line", "the request line is not HTTP/1.1"
            )
        if not _TARGET.fullmatch(parts[1]):
            raise BadRequestError(
                "bad_request_line", "the request target is not an absolute path"
            )
        fields = _field_lines(lines[1:])
        http11 = parts[2] == b"HTTP/1.1"
        if http11 and "host" not in fields:
            raise BadRequestError(
                "bad_request", "an HTTP/1.1 request needs a Host field"
            )
        if "transfer-encoding" in fields:
            raise BadRequestError(
                "length_required",
                "send the body with Content-Length (Transfer-Encoding is not taken)",
                411,
            )
        length = fields.get("content-length", "0")
        if not _DIGITS.fullmatch(length.encode("latin-1")):
            # also two Content-Length fields (joined by ", ")
            raise BadRequestError(
                "bad_header", "Content-Length is not one decimal number"
            )
        self._need = int(length)
        if self._need > self._max_body:
            raise BadRequestError(*self._too_large, 413)
        connection = fields.get("connection", "")
        keep = (
            not _has_token(connection, "close")
            if http11
            else _has_token(connection, "keep-alive")
        )
        target = parts[1].decode("ascii")
        path, _, query = target.partition("?")
        self.expects_continue = http11 and _has_token(
            fields.get("expect", ""), "100-continue"
        )
        self._head = (parts[0].decode("ascii"), path, query, fields, keep)
