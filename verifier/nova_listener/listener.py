"""Nova notification listener: enrolment follows the instance.

An oslo.messaging notification listener on Nova's versioned notifications
(topic ``versioned_notifications``, exchange ``nova``):

``instance.create.end``
    the instance exists: the verifier may start waiting for its agent
    (``POST /v1/nodes/{uuid}/instance-created``, see
    :mod:`verifier.attest.pending`).
``instance.delete.end``
    the instance is gone: unenrol it (``DELETE /v1/nodes/{uuid}``).
``instance.create.end`` and the ends of resize, cold and live migration
    the payload's ``host`` runs the instance now: the verifier learns it
    (``PUT /v1/nodes/{uuid}/host``: the node's status carries that compute
    host's verdict, and a host found untrusted marks it), and so do hooks
    (:meth:`InstanceHook.instance_placed`; the ``vtpm`` hook records it at
    the registrar, which binds the vTPM's EK to that host's CA).

Instances nobody enrolled are ignored (the verifier answers 404). When the
verifier cannot be reached the event is requeued, so it is not lost. It
calls the verifier over mTLS with a certificate in the verifier's
``operator`` role; then every configured :class:`InstanceHook` runs. A hook
raising :class:`InstanceHookRetryError` requeues the event too (every step runs
again on redelivery: the verifier's answer 404 and idempotent hooks make
that harmless); any other hook failure is logged.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Mapping, Sequence
from typing import Any

import oslo_messaging

from verifier.common.errors import TransportError
from verifier.common.http import BlockingClient
from verifier.exceptions import VerifierError
from verifier.nova_listener.hooks import (
    InstanceHook,
    InstanceHookError,
    InstanceHookRetryError,
)

__all__ = [
    "CREATE_END",
    "DELETE_END",
    "InstanceEndpoint",
    "PLACED_EVENTS",
    "ListenerError",
    "VerifierOperator",
    "make_listener",
]

LOG = logging.getLogger(__name__)
CREATE_END = "instance.create.end"
DELETE_END = "instance.delete.end"
#: Events after which the payload's ``host`` runs the instance.
PLACED_EVENTS = frozenset(
    {
        CREATE_END,
        "instance.resize_finish.end",
        "instance.resize_confirm.end",
        "instance.resize_revert.end",
        "instance.live_migration_post_dest.end",
        "instance.live_migration_rollback_dest.end",
    }
)


class ListenerError(VerifierError):
    """The verifier could not be reached or failed (worth a retry)."""


class VerifierOperator:
    """The listener's client of the verifier API (operator role).

    Args:
        url: the verifier's base URL.
        context: mTLS client context (None: plain HTTP, tests only).
        timeout: seconds per request.
    """

    def __init__(
        self, url: str, context: ssl.SSLContext | None, timeout: float = 10.0
    ) -> None:
        if not url.startswith(("https://", "http://")):
            raise ValueError(f"verifier URL {url!r} is not http(s)")
        self._url = url.rstrip("/")
        self._http = BlockingClient(context, timeout)

    def _call(self, method: str, path: str, body: Any = None) -> int:
        try:
            answer = self._http.request(
                method, self._url + path, json=body, expect_json=False
            )
        except TransportError as exc:
            raise ListenerError(str(exc))
        if answer.ok or answer.status in (404, 409):
            return answer.status
        raise ListenerError(
            f"{method} {path}: HTTP {answer.status} {answer.error.message}"
        )

    def instance_created(self, uuid: str) -> bool:
        """Returns: False if the verifier does not know the node."""
        return self._call("POST", f"/v1/nodes/{uuid}/instance-created") == 200

    def unenrol(self, uuid: str) -> bool:
        """Returns: False if the verifier does not know the node."""
        return self._call("DELETE", f"/v1/nodes/{uuid}") == 204

    def place(self, uuid: str, host: str) -> bool:
        """The node's instance runs on compute host ``host`` now (its
        status carries that host's verdict, and the host's failure marks
        it). Returns: False if the verifier does not know the node."""
        return self._call("PUT", f"/v1/nodes/{uuid}/host", {"host": host}) == 200


def instance_uuid(payload: Any) -> str | None:
    """The instance UUID of a versioned instance notification payload."""
    if isinstance(payload, Mapping):
        data = payload.get("nova_object.data")
        if isinstance(data, Mapping) and isinstance(data.get("uuid"), str):
            return str(data["uuid"])
    return None


def instance_host(payload: Any) -> str | None:
    """The compute host of a versioned instance notification payload."""
    if isinstance(payload, Mapping):
        data = payload.get("nova_object.data")
        if isinstance(data, Mapping) and isinstance(data.get("host"), str):
            return str(data["host"]) or None
    return None


class InstanceEndpoint:
    """The notification endpoint: INFO-priority instance create/delete ends
    and the ends of the operations that move an instance."""

    filter_rule = oslo_messaging.NotificationFilter(
        event_type=r"^instance\.(create|delete|resize_finish|resize_confirm|"
        r"resize_revert|live_migration_post_dest|live_migration_rollback_dest)"
        r"\.end$"
    )

    def __init__(
        self, operator: VerifierOperator, hooks: Sequence[InstanceHook] = ()
    ) -> None:
        self._operator = operator
        self._hooks = list(hooks)

    def info(
        self,
        ctxt: Any,
        publisher_id: str,
        event_type: str,
        payload: Any,
        metadata: Any,
    ) -> Any:
        uuid = instance_uuid(payload)
        if uuid is None:
            LOG.warning("%s from %s without an instance UUID", event_type, publisher_id)
            return oslo_messaging.NotificationResult.HANDLED
        placed = oslo_messaging.NotificationResult.HANDLED
        host = instance_host(payload)
        if event_type in PLACED_EVENTS and host is not None:
            placed = self._place(event_type, uuid, host)
        if event_type not in (CREATE_END, DELETE_END):
            return placed
        try:
            if event_type == CREATE_END:
                known = self._operator.instance_created(uuid)
                verb = "marked created"
            else:
                known = self._operator.unenrol(uuid)
                verb = "unenrolled"
        except ListenerError as exc:
            LOG.warning(
                "%s of %s: verifier unavailable, requeued: %s", event_type, uuid, exc
            )
            return oslo_messaging.NotificationResult.REQUEUE
        if known:
            LOG.info("Instance %s: %s (%s)", uuid, verb, event_type)
        result = self._run_hooks(event_type, uuid)
        requeue = oslo_messaging.NotificationResult.REQUEUE
        return requeue if placed == requeue else result

    def _place(self, event_type: str, uuid: str, host: str) -> Any:
        """Tell the verifier and the hooks where ``uuid`` runs now; REQUEUE
        when either must see the event again."""
        result = self._run_placed(event_type, uuid, host)
        try:
            self._operator.place(uuid, host)
        except ListenerError as exc:
            LOG.warning(
                "%s of %s: verifier unavailable, requeued: %s", event_type, uuid, exc
            )
            return oslo_messaging.NotificationResult.REQUEUE
        return result

    def _run_placed(self, event_type: str, uuid: str, host: str) -> Any:
        result = oslo_messaging.NotificationResult.HANDLED
        for hook in self._hooks:
            try:
                hook.instance_placed(uuid, host)
            except InstanceHookRetryError as exc:
                LOG.warning(
                    "Hook failed on %s of %s, requeued: %s", event_type, uuid, exc
                )
                result = oslo_messaging.NotificationResult.REQUEUE
            except InstanceHookError as exc:
                LOG.error("Hook failed on %s of %s: %s", event_type, uuid, exc)
        return result

    def _run_hooks(self, event_type: str, uuid: str) -> Any:
        result = oslo_messaging.NotificationResult.HANDLED
        for hook in self._hooks:
            try:
                if event_type == CREATE_END:
                    hook.instance_created(uuid)
                else:
                    hook.instance_deleted(uuid)
            except InstanceHookRetryError as exc:
                LOG.warning(
                    "Hook failed on %s of %s, requeued: %s", event_type, uuid, exc
                )
                result = oslo_messaging.NotificationResult.REQUEUE
            except InstanceHookError as exc:
                LOG.error("Hook failed on %s of %s: %s", event_type, uuid, exc)
        return result


def make_listener(
    transport: oslo_messaging.Transport,
    endpoint: InstanceEndpoint,
    topics: Sequence[str] = ("versioned_notifications",),
    exchange: str = "nova",
    pool: str | None = "trusted-cloud",
) -> Any:
    """A started-on-demand oslo.messaging notification listener (threading
    executor; call ``start()``, then ``stop()`` and ``wait()``)."""
    targets = [oslo_messaging.Target(topic=t, exchange=exchange) for t in topics]
    return oslo_messaging.get_notification_listener(
        transport,
        targets,
        [endpoint],
        executor="threading",
        allow_requeue=True,
        pool=pool,
    )
