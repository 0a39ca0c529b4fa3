"""The revocation listener: receives signed events and runs the consumer.

Two transports feed one :class:`~ipsec_puppet_vault_hooks.consumer.Consumer`:

* **webhook**: ``POST /v1/events`` over HTTPS with mutual TLS (clients
  named in ``[revocation_listener] webhook_clients``). The answer is 200
  only after the event was verified and every action ran (or had already
  run for that event id): the verifier's ``webhook`` notifier takes that
  as the acknowledgement. A body that is not an event gets 400, a bad
  signature 422, a state-saving failure 503, each with a JSON body.
* **messaging** (:mod:`ipsec_puppet_vault_hooks.messaging`, the
  ``messaging`` extra): an oslo.messaging notification listener on the
  durable queue ``<topic>.warn``.

``GET /v1/stats`` returns the counters.

Actions that gave up on an event (their target was down longer than their
retries) are dead-lettered; :meth:`EventHandler.redrive` tries each of
them again, every ``[revocation_listener] redrive_interval`` seconds,
until it succeeds, so an outage of one target loses nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Mapping
from typing import Any

from aiohttp import web
from oslo_log import log as logging

from ipsec_puppet_vault_hooks import _jsonl
from ipsec_puppet_vault_hooks.consumer import Consumer, ConsumeResult
from ipsec_puppet_vault_hooks.exceptions import EventRejectedError, HooksError
from verifier.common import api_schemas, openapi
from verifier.common.errors import RequestError
from verifier.common.web import (
    allow,
    authz_middleware,
    error_middleware,
    json_response,
    read_json,
)
from verifier.protocol import RevocationEvent

__all__ = ["EventHandler", "Stats", "make_app"]

LOG = logging.getLogger(__name__)


@dataclasses.dataclass
class Stats:
    """Counters of the listener (reset at start)."""

    received: int = 0
    handled: int = 0
    duplicates: int = 0
    dead_lettered: int = 0
    malformed: int = 0
    bad_signature: int = 0
    state_errors: int = 0
    redriven: int = 0


class EventHandler:
    """Runs the consumer on one event at a time and counts outcomes.

    Args:
        consumer: the configured consumer (its stores are not thread-safe,
            so calls are serialised).
        redriven_file: JSON-lines file of the dead letters already redriven
            (None: kept in memory).
    """

    def __init__(self, consumer: Consumer, redriven_file: str | None = None) -> None:
        self.consumer = consumer
        self.stats = Stats()
        self._lock = threading.Lock()
        self._redriven_file = redriven_file
        records = _jsonl.read(redriven_file) if redriven_file else []
        self._redriven = {(r.get("event_id"), r.get("action")) for r in records}

    def redrive(self) -> int:
        """Try every dead-lettered (event, action) not yet redriven once more.

        Returns:
            How many succeeded this time (they are not tried again).
        """
        actions = {a.name: a for a in self.consumer.actions}
        succeeded = 0
        for letter in self.consumer.dead_letters:
            key = (letter.event_id, letter.action)
            action = actions.get(letter.action)
            if key in self._redriven or action is None:
                continue
            try:
                event = RevocationEvent(**letter.event)
            except Exception as exc:  # a damaged record: leave it to the operator
                LOG.error("Dead letter %s is not an event: %s", key, exc)
                continue
            with self._lock:
                try:
                    action.handle(event)
                except HooksError as exc:
                    LOG.warning(
                        "Redrive of %s on event %s failed: %s",
                        letter.action,
                        letter.event_id,
                        exc,
                    )
                    continue
                record = {"event_id": letter.event_id, "action": letter.action}
                if self._redriven_file:
                    try:
                        _jsonl.append(self._redriven_file, record)
                    except OSError as exc:
                        LOG.error("Cannot record redrive of %s: %s", key, exc)
                self._redriven.add(key)
                self.stats.redriven += 1
                succeeded += 1
                LOG.info("Redrove %s on event %s", letter.action, letter.event_id)
        return succeeded

    def handle(self, data: Mapping[str, Any]) -> ConsumeResult:
        """Verify and act on one event.

        Raises:
            EventRejectedError: malformed or badly signed (counted, logged).
            HooksError: the consumer's state could not be saved.
        """
        with self._lock:
            self.stats.received += 1
            try:
                result = self.consumer.consume(data)
            except EventRejectedError as exc:
                if exc.reason == "malformed":
                    self.stats.malformed += 1
                else:
                    self.stats.bad_signature += 1
                LOG.warning("Rejected revocation event: %s", exc)
                raise
            except HooksError as exc:
                self.stats.state_errors += 1
                LOG.error("Could not record revocation event: %s", exc)
                raise
            if result.duplicate:
                self.stats.duplicates += 1
            else:
                self.stats.handled += 1
            self.stats.dead_lettered += len(result.dead_lettered)
            return result


_HANDLER = web.AppKey("handler", EventHandler)


@allow("verifier")
async def _post_event(request: web.Request) -> web.Response:
    handler = request.app[_HANDLER]
    try:
        data = await read_json(request)
    except RequestError:
        with handler._lock:
            handler.stats.received += 1
            handler.stats.malformed += 1
        raise
    try:
        result = await asyncio.to_thread(handler.handle, data)
    except EventRejectedError as exc:
        status = 400 if exc.reason == "malformed" else 422
        raise RequestError(exc.reason, exc.detail, status) from exc
    except HooksError as exc:
        raise RequestError("state", str(exc), 503) from exc
    return json_response(
        {
            "event_id": result.event_id,
            "duplicate": result.duplicate,
            "dead_lettered": list(result.dead_lettered),
        }
    )


@allow("verifier")
async def _stats(request: web.Request) -> web.Response:
    return json_response(dataclasses.asdict(request.app[_HANDLER].stats))


def make_app(handler: EventHandler, clients: list[str]) -> web.Application:
    """The webhook application.

    Args:
        handler: runs the consumer.
        clients: certificate CNs allowed to post events.
    """
    app = web.Application(
        middlewares=[error_middleware, authz_middleware({"verifier": clients})],
        client_max_size=64 * 1024,
    )
    app[_HANDLER] = handler
    app.router.add_post("/v1/events", _post_event)
    app.router.add_get("/v1/stats", _stats)
    openapi.add_route(app, "trusted-cloud revocation listener", api_schemas.LISTENER)
    return app
