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
_INSTALLED = False


def new_request_id() -> tuple[str, contextvars.Token[str | None]]:
    """A fresh ``req-<uuid4>``, current until the token is reset."""
    request_id = f"req-{uuid.uuid4()}"
    return request_id, _REQUEST_ID.set(request_id)


def reset_request_id(token: contextvars.Token[str | None]) -> None:
    _REQUEST_ID.reset(token)


def current_request_id() -> str | None:
    """The id of the request being served (None outside one)."""
    return _REQUEST_ID.get()


def install_log_request_ids() -> None:
    """Give every log record the current request id as ``request_id``
    (once per process; records outside a request are left alone)."""
    global _INSTALLED
    if _INSTALLED:
        return
    _INSTALLED = True
    factory = logging.getLogRecordFactory()

    def make(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = factory(*args, **kwargs)
        request_id = _REQUEST_ID.get()
        if request_id is not None and not getattr(record, "request_id", None):
            record.request_id = request_id
        return record

    logging.setLogRecordFactory(make)
