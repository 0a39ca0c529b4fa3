"""The revocation listener's oslo.messaging transport (the ``messaging``
extra): a notification listener on the durable queue ``<topic>.warn``
feeding the listener's :class:`~ipsec_puppet_vault_hooks.listener.EventHandler`.

The broker message is acknowledged after the consumer returned, requeued
when its state could not be saved, and acknowledged (dropped, counted,
logged) when the event is rejected, so bad input never loops.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import oslo_messaging
from oslo_config import cfg
from oslo_log import log as logging

from ipsec_puppet_vault_hooks.exceptions import EventRejectedError, HooksError
from ipsec_puppet_vault_hooks.listener import EventHandler

__all__ = [
    "EVENT_TYPE_FILTER",
    "HANDLED",
    "REQUEUE",
    "MessagingEndpoint",
    "messaging_server",
]

LOG = logging.getLogger(__name__)

#: The event_type filter (a regex) matching the verifier's notifications
#: (``trusted.`` + the revocation event's type).
EVENT_TYPE_FILTER = r"^trusted\."
HANDLED: str = oslo_messaging.NotificationResult.HANDLED
REQUEUE: str = oslo_messaging.NotificationResult.REQUEUE


class MessagingEndpoint:
    """oslo.messaging notification endpoint for revocation events."""

    filter_rule = oslo_messaging.NotificationFilter(event_type=EVENT_TYPE_FILTER)

    def __init__(self, handler: EventHandler) -> None:
        self._handler = handler

    def warn(
        self,
        ctxt: Mapping[str, Any],
        publisher_id: str,
        event_type: str,
        payload: Any,
        metadata: Mapping[str, Any],
    ) -> str:
        """Handle one notification; returns HANDLED or REQUEUE."""
        if not isinstance(payload, Mapping):
            with self._handler._lock:
                self._handler.stats.received += 1
                self._handler.stats.malformed += 1
            LOG.warning("Dropped %s notification: payload is not an object", event_type)
            return HANDLED
        try:
            self._handler.handle(payload)
        except EventRejectedError:
            return HANDLED
        except HooksError:
            return REQUEUE
        return HANDLED


def messaging_server(
    conf: cfg.ConfigOpts, handler: EventHandler
) -> oslo_messaging.MessageHandlingServer:
    """A (not yet started) notification listener feeding ``handler``."""
    group = conf.revocation_listener
    transport = oslo_messaging.get_notification_transport(conf, url=group.transport_url)
    return oslo_messaging.get_notification_listener(
        transport,
        [oslo_messaging.Target(topic=group.topic)],
        [MessagingEndpoint(handler)],
        executor="threading",
        allow_requeue=True,
    )
