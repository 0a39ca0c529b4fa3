"""Shared HTTP plumbing for the REST APIs (registrar, verifier, agent).

Every refusal is a JSON body ``{"error": {"code": ..., "message": ...}}``
(:class:`~verifier.protocol.messages.errors.ErrorBody`) with a 4xx status;
an unexpected failure is logged and answered with a generic 500 JSON body,
never a traceback. Every response carries a request id, and
``/healthcheck`` answers on every service
(:mod:`verifier.common.conventions`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any, TypeVar

from aiohttp import web

from verifier.common import conventions
from verifier.common.errors import RequestError
from verifier.protocol import jsonlimits
from verifier.protocol.errors import EnvelopeError, MalformedError
from verifier.protocol.messages.errors import MAX_ERROR_MESSAGE, ErrorBody

__all__ = [
    "Handler",
    "allow",
    "authz_middleware",
    "error_middleware",
    "json_response",
    "is_anonymous",
    "parse_json_body",
    "peer_common_name",
    "read_json",
]

LOG = logging.getLogger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error(status: int, code: str, message: str) -> web.Response:
    body = ErrorBody(code or "error", message[:MAX_ERROR_MESSAGE])
    return web.json_response(body.to_dict(), status=status)


@web.middleware
async def error_middleware(
    request: web.Request, handler: Handler
) -> web.StreamResponse:
    """Map our exceptions and aiohttp's HTTP errors to JSON bodies; stamp
    the request id on the response; answer ``/healthcheck``."""
    request_id, token = conventions.new_request_id()
    try:
        if request.path == conventions.HEALTHCHECK_PATH and request.method in (
            "GET",
            "HEAD",
        ):
            response: web.StreamResponse = web.Response(text="OK")
        else:
            response = await _answer(request, handler)
        if not response.prepared:
            response.headers[conventions.REQUEST_ID_HEADER] = request_id
        return response
    finally:
        conventions.reset_request_id(token)


async def _answer(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except RequestError as exc:
        return _error(exc.status, exc.code, exc.detail)
    except MalformedError as exc:  # "bad_field" or "malformed"
        return _error(400, exc.code, str(exc))
    except EnvelopeError as exc:
        return _error(400, "envelope", exc.detail)
    except web.HTTPRequestEntityTooLarge:
        return _error(413, "too_large", "request body is too large")
    except web.HTTPException as exc:
        return _error(exc.status, exc.reason.lower().replace(" ", "_"), exc.reason)
    except Exception:  # process boundary: log and keep serving
        LOG.exception("unexpected error serving %s %s", request.method, request.path)
        return _error(500, "internal", "internal error; see the service log")


def parse_json_body(body: bytes) -> Mapping[str, Any]:
    """A request body as a JSON object, within the limits of
    :mod:`verifier.protocol.jsonlimits` (nesting depth, 64-bit integers,
    finite numbers).

    Raises:
        RequestError: ``bad_json`` (400) naming what is wrong and where.
    """
    try:
        data: Mapping[str, Any] = jsonlimits.loads(
            body, "request body", object_only=True
        )
    except MalformedError as exc:
        raise RequestError("bad_json", exc.detail) from None
    return data


async def read_json(
    request: web.Request, limit: int | None = None
) -> Mapping[str, Any]:
    """The whole request body (up to ``limit`` bytes, else the
    application's ``client_max_size``; 413 ``too_large`` beyond) as a JSON
    object.

    Raises:
        RequestError: ``bad_json`` if the body is not a JSON object within
            the limits (see :func:`parse_json_body`).
    """
    if limit is None:
        return parse_json_body(await request.read())
    body = bytearray()
    while chunk := await request.content.read(min(limit + 1 - len(body), 256 * 1024)):
        body += chunk
        if len(body) > limit:
            raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=len(body))
    return parse_json_body(bytes(body))


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status)


_F = TypeVar("_F", bound=Callable[..., Any])


def allow(*roles: str, anonymous: bool = False) -> Callable[[_F], _F]:
    """Mark a handler as callable only by clients in one of ``roles``.

    Args:
        roles: the roles whose members may call it.
        anonymous: callers without a client certificate may call it too
            (the handler learns it from :func:`is_anonymous` and must
            authenticate them by other means, e.g. a TPM).
    """

    def mark(handler: _F) -> _F:
        handler.roles = frozenset(roles)  # type: ignore[attr-defined]
        handler.anonymous = anonymous  # type: ignore[attr-defined]
        return handler

    return mark


def peer_common_name(request: web.Request) -> str | None:
    """The CN of the verified client certificate, or None without mTLS."""
    transport = request.transport
    ssl_object = transport.get_extra_info("ssl_object") if transport else None
    if ssl_object is None:
        return None
    cert = ssl_object.getpeercert()
    for rdn in (cert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


_ANONYMOUS = "trusted_cloud.anonymous"


def is_anonymous(request: web.Request) -> bool:
    """True if :func:`authz_middleware` let a caller without a client
    certificate through to a handler marked ``anonymous``."""
    return bool(request.get(_ANONYMOUS, False))


def authz_middleware(members: Mapping[str, Collection[str]]) -> Any:
    """Refuse clients whose certificate CN is in none of the roles a
    handler was marked with by :func:`allow`: 401 without a certificate
    (unless the handler takes anonymous callers), 403 with another one.

    Args:
        members: role name -> certificate common names in that role.
    """

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        roles = getattr(request.match_info.handler, "roles", None)
        if roles is not None:
            name = peer_common_name(request)
            if name is None and getattr(request.match_info.handler, "anonymous", False):
                request[_ANONYMOUS] = True
            elif name is None:
                raise RequestError(
                    "unauthorized",
                    f"{request.method} {request.path} needs a client certificate "
                    f"(role {' or '.join(sorted(roles))})",
                    401,
                )
            elif not any(name in members.get(r, ()) for r in roles):
                raise RequestError(
                    "forbidden",
                    f"client {name!r} may not {request.method} {request.path} "
                    f"(needs role {' or '.join(sorted(roles))})",
                    403,
                )
        return await handler(request)

    return middleware
