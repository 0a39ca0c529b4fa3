"""The ``messaging`` notifier: oslo.messaging notifications (RabbitMQ).

Each event is sent as one notification:

* event type ``trusted.node.revoked`` (``trusted.`` + the event's
  ``type``), priority ``warn``, publisher id ``trusted-verifier.<host>``;
* payload: the signed event wire dict ``{"event": {...}, "signature":
  "<b64>", "key_id": "<hex>"}``, verified by the consumer before it acts.

Acknowledgement: the rabbit driver publishes with publisher confirms
(``confirm_publish``) persistent messages to a durable queue
``<topic>.warn`` that it declares itself, so the broker has the event on
disk, even with no consumer yet, before ``deliver`` returns; only then is
the event marked delivered. The driver sends through the transport
rather than ``oslo_messaging.Notifier``, because the latter logs and
swallows a failed publish, which would mark a lost event delivered.
The consumer acknowledges the broker message only after its actions
ran (``trusted-revocation-listener`` returns ``HANDLED`` after
:meth:`Consumer.consume`, ``REQUEUE`` when its state could not be
saved), so every hop is at-least-once.
"""

from __future__ import annotations

import datetime
import socket
import threading
from collections.abc import Mapping
from typing import Any

import oslo_messaging
from cryptography.hazmat.primitives.asymmetric import ed25519
from oslo_config import cfg

from verifier.conf import notifiers as notifiers_conf
from verifier.exceptions import ConfigError
from verifier.notify.base import Notifier, NotifierError

__all__ = ["EVENT_TYPE_PREFIX", "PRIORITY", "MessagingNotifier"]

EVENT_TYPE_PREFIX = "trusted."
PRIORITY = "warn"


def durable_queues(conf: cfg.ConfigOpts) -> bool:
    """Whether the rabbit driver declares durable queues."""
    group = conf.oslo_messaging_rabbit
    return bool(group.amqp_durable_queues or group.rabbit_quorum_queue)


class MessagingNotifier(Notifier):
    """Publishes each event as an oslo.messaging notification.

    Raises:
        ConfigError: if the transport URL is bad, or queues are not durable
            while ``require_durable`` is set.
    """

    name = "messaging"

    def __init__(self, conf: cfg.ConfigOpts, public_key: ed25519.Ed25519PublicKey):
        super().__init__(conf, public_key)
        notifiers_conf.register_opts(conf)
        group = conf.notifier_messaging
        try:
            self._transport = oslo_messaging.get_notification_transport(
                conf, url=group.transport_url
            )
        except (
            oslo_messaging.InvalidTransportURL,
            oslo_messaging.DriverLoadFailure,
        ) as exc:
            raise ConfigError(f"[notifier_messaging] transport_url: {exc}") from exc
        if group.require_durable and not durable_queues(conf):
            raise ConfigError(
                "[notifier_messaging] needs [oslo_messaging_rabbit] "
                "amqp_durable_queues = true (or rabbit_quorum_queue): a "
                "transient queue loses events when the broker restarts"
            )
        self._target = oslo_messaging.Target(topic=f"{group.topic}.{PRIORITY}")
        self._publisher = f"trusted-verifier.{socket.gethostname()}"
        self._retry = group.retry
        self._lock = threading.Lock()

    def _deliver(self, event: Mapping[str, Any]) -> bool:
        inner = event.get("event")
        kind = inner.get("type") if isinstance(inner, Mapping) else None
        event_type = EVENT_TYPE_PREFIX + (kind if isinstance(kind, str) else "event")
        message = {
            "message_id": inner.get("id") if isinstance(inner, Mapping) else None,
            "publisher_id": self._publisher,
            "event_type": event_type,
            "priority": PRIORITY.upper(),
            "payload": dict(event),
            "timestamp": str(datetime.datetime.now(datetime.UTC).replace(tzinfo=None)),
        }
        try:
            with self._lock:
                # Raises unless the broker confirmed the persistent publish
                # within ``retry`` reconnections.
                self._transport._send_notification(
                    self._target, {}, message, version=2.0, retry=self._retry
                )
        except Exception as exc:
            raise NotifierError(
                f"messaging: the broker did not take the event: {exc}"
            ) from exc
        return True

    def close(self) -> None:
        """Close the broker connection."""
        self._transport.cleanup()
