"""A database that is busy or away is a 503 the caller may retry, not a
500.

SQLite answers ``database is locked`` when a writer waited longer than its
busy timeout (an enrolment storm behind the write-behind of 10,000 nodes
did); PostgreSQL and MySQL/MariaDB answer with an operational error when
the server is restarting, a connection broke, or a lock wait or deadlock
was cut short; the pool times out when every connection is in use. In
each case nothing of the request was stored (its transaction rolled
back), so the services answer ``503 database_busy`` with ``Retry-After``
and the tenant's tools ask again (:mod:`nova_plugin.services`). The log
names the driver's error class and first line only: never the statement
or its parameters.
"""

from __future__ import annotations

import logging

from aiohttp import web
from sqlalchemy import exc as sa_exc

from verifier.common.web import Handler
from verifier.protocol.messages.errors import ErrorBody

__all__ = ["RETRY_AFTER", "TRANSIENT", "database_busy_middleware", "describe"]

LOG = logging.getLogger(__name__)

#: Seconds a caller waits before it asks again.
RETRY_AFTER = 1
#: The errors of a database that may answer a moment later.
TRANSIENT = (sa_exc.OperationalError, sa_exc.TimeoutError, sa_exc.DisconnectionError)


def describe(error: BaseException) -> str:
    """The driver's error class and the first line of its message (at most
    200 characters): what an operator needs, without the SQL statement or
    its parameters (a node's *V* share is one)."""
    orig = getattr(error, "orig", None) or error
    text = str(orig.args[0]) if getattr(orig, "args", None) else ""
    return f"{type(orig).__name__}: {text.splitlines()[0][:200] if text else ''}"


@web.middleware
async def database_busy_middleware(
    request: web.Request, handler: Handler
) -> web.StreamResponse:
    """Answer a transient database error with ``503 database_busy`` and
    ``Retry-After`` (inside :func:`~verifier.common.web.error_middleware`,
    which stamps the request id)."""
    try:
        return await handler(request)
    except TRANSIENT as exc:
        LOG.warning(
            "database busy serving %s %s: %s",
            request.method,
            request.path,
            describe(exc),
        )
        body = ErrorBody(
            "database_busy",
            "the service's database is busy or unreachable; nothing was "
            f"changed: try again in {RETRY_AFTER} s",
        )
        return web.json_response(
            body.to_dict(), status=503, headers={"Retry-After": str(RETRY_AFTER)}
        )
