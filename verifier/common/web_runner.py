"""The aiohttp runner of every server: requests that do not parse as HTTP
get the JSON error body too.

aiohttp's HTTP parser refuses a request line longer than
:data:`MAX_LINE_SIZE` or a header longer than :data:`MAX_FIELD_SIZE` (and
any other message that is not HTTP/1.1) before a handler or a middleware
runs; its own answer is a plain-text 400 that echoes the offending line,
and it logs the parser's exception with its traceback (issue 33). Here
the connection's request handler answers these with the JSON error body
of :mod:`verifier.common.web` naming the problem -- never the line, which
may carry a token -- and logs one WARNING line without it.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from aiohttp import http_exceptions, web, web_protocol, web_request, web_server

__all__ = ["MAX_FIELD_SIZE", "MAX_LINE_SIZE", "AppRunner", "parse_refusal"]

LOG = logging.getLogger(__name__)

#: The longest request line (method, target, version) taken, in bytes.
MAX_LINE_SIZE = 8190
#: The longest header (name and value) taken, in bytes (the same limit:
#: aiohttp's parsers do not say which of the two was too long).
MAX_FIELD_SIZE = MAX_LINE_SIZE


def parse_refusal(exc: BaseException | None) -> tuple[str, str]:
    """The error code and message for a request the parser refused; they
    never quote the request."""
    if isinstance(exc, http_exceptions.LineTooLong):
        return (
            "line_too_long",
            f"the request line (method and URL) or a header exceeds "
            f"{MAX_LINE_SIZE} bytes",
        )
    if isinstance(exc, http_exceptions.BadStatusLine):
        return "bad_request_line", "the request line is not HTTP/1.1"
    if isinstance(exc, http_exceptions.InvalidHeader):
        return "bad_header", "a header is not valid HTTP/1.1"
    return "bad_request", "the request is not valid HTTP/1.1"


class _RequestHandler(web_protocol.RequestHandler):
    """aiohttp's connection handler, answering unparsable requests in JSON."""

    __slots__ = ()

    def handle_error(
        self,
        request: web_request.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status != 400 or not isinstance(exc, http_exceptions.HttpProcessingError):
            return super().handle_error(request, status, exc, message)
        code, detail = parse_refusal(exc)
        LOG.warning("Refused a request from %s: %s: %s", request.remote, code, detail)
        if request.writer.output_size > 0:  # pragma: no cover - nothing sent yet
            raise ConnectionError("an answer was sent already")
        body = json.dumps({"error": {"code": code, "message": detail}})
        resp = web.Response(status=400, text=body, content_type="application/json")
        resp.force_close()
        return resp


class _Server(web_server.Server):
    """The connection factory, making :class:`_RequestHandler` s."""

    def __call__(self) -> web_protocol.RequestHandler:
        return _RequestHandler(self, loop=self._loop, **self._kwargs)


class AppRunner(web.AppRunner):
    """:class:`aiohttp.web.AppRunner` with the limits above and JSON answers
    to requests that do not parse; no access log (the services log their
    own lines)."""

    def __init__(self, app: web.Application, **kwargs: Any) -> None:
        kwargs.setdefault("access_log", None)
        kwargs.setdefault("max_line_size", MAX_LINE_SIZE)
        kwargs.setdefault("max_field_size", MAX_FIELD_SIZE)
        super().__init__(app, **kwargs)

    async def _make_server(self) -> web_server.Server:
        server = await super()._make_server()
        server.__class__ = _Server
        return server
