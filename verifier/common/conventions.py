"""OpenStack service conventions on our aiohttp services.

oslo.middleware's ``RequestId`` and ``Healthcheck`` are WSGI middleware and
cannot wrap an aiohttp application, so they are done equivalently here,
for every service (verifier, registrar, key service, node agent, hooks
listener), from the one middleware they all run first
(:func:`verifier.common.web.error_middleware`):

* every response carries ``X-OpenStack-Request-ID: req-<uuid4>``, a fresh
  id per request as ``RequestId`` makes it; log records written while the
  request is served carry it as ``request_id`` (oslo.log then uses its
  ``logging_context_format_string``, which shows it);
* ``GET|HEAD /healthcheck`` answers ``200 OK`` (text) without
  authentication, as ``Healthcheck`` with its default backend does; it
  says the process serves requests, nothing more.

The caller's oslo.context ``RequestContext`` (user, project, roles) is
"current" for the request it came with only. oslo.context keeps the
current context per *thread* (as it was per greenthread under eventlet);
on an event loop that would make a tenant's context current for every
task of the loop until the next request -- oslo.log would put the
tenant's request id and identity on the quote loop's lines. So the
services keep it per asyncio task instead (a context variable, copied
into the worker threads a task starts), scoped to the request's
middleware, and a context made for a request takes the request's own id
(:func:`install_log_request_ids`).
"""

from __future__ import annotations

import contextvars
import logging
import uuid
from typing import Any

__all__ = [
    "HEALTHCHECK_PATH",
    "REQUEST_ID_HEADER",
    "current_request_id",
    "install_log_request_ids",
    "new_request_id",
    "reset_request_id",
]

REQUEST_ID_HEADER = "X-OpenStack-Request-ID"
HEALTHCHECK_PATH = "/healthcheck"
_REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "request_id", default=None
)
#: oslo.context's current context (a RequestContext) of this task
_OSLO_CONTEXT: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "oslo_context", default=None
)
_INSTALLED = False
RequestTokens = tuple[contextvars.Token[str | None], contextvars.Token[Any]]


def new_request_id() -> tuple[str, RequestTokens]:
    """A fresh ``req-<uuid4>``, current (with no oslo.context context yet)
    until the tokens are reset."""
    request_id = f"req-{uuid.uuid4()}"
    return request_id, (_REQUEST_ID.set(request_id), _OSLO_CONTEXT.set(None))


def reset_request_id(tokens: RequestTokens) -> None:
    """End the request: its id and its oslo.context context are no longer
    current."""
    _REQUEST_ID.reset(tokens[0])
    _OSLO_CONTEXT.reset(tokens[1])


def current_request_id() -> str | None:
    """The id of the request being served (None outside one)."""
    return _REQUEST_ID.get()


class _TaskLocalStore:
    """Stands in for oslo.context's thread-local store of the current
    context: the same ``context`` attribute, kept in a context variable
    (per asyncio task; a worker thread started by a task sees a copy)."""

    __slots__ = ()

    @property
    def context(self) -> Any:
        current = _OSLO_CONTEXT.get()
        if current is None:
            raise AttributeError("context")
        return current

    @context.setter
    def context(self, value: Any) -> None:
        _OSLO_CONTEXT.set(value)

    @context.deleter
    def context(self) -> None:
        _OSLO_CONTEXT.set(None)


def install_log_request_ids() -> None:
    """Give every log record the current request id as ``request_id``
    (records outside a request are left alone), and make oslo.context's
    current context per asyncio task, not per thread (see the module
    docstring). Once per process."""
    global _INSTALLED
    if _INSTALLED:
        return
    _INSTALLED = True
    from oslo_context import context  # with oslo.log, in every role that logs

    context._request_store = _TaskLocalStore()  # type: ignore[assignment]
    factory = logging.getLogRecordFactory()

    def make(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = factory(*args, **kwargs)
        request_id = _REQUEST_ID.get()
        if request_id is not None and not getattr(record, "request_id", None):
            record.request_id = request_id
        return record

    logging.setLogRecordFactory(make)
