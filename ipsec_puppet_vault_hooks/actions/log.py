"""The ``log`` action: log the event (a revocation, or a node that failed,
went unreachable or recovered) and optionally record it."""

from __future__ import annotations

from oslo_config import cfg
from oslo_log import log as logging

from ipsec_puppet_vault_hooks import _jsonl
from ipsec_puppet_vault_hooks.actions.base import Action
from ipsec_puppet_vault_hooks.conf import action_log as action_log_conf
from verifier.protocol import RevocationEvent

__all__ = ["LogAction"]

LOG = logging.getLogger(__name__)


class LogAction(Action):
    """Logs a warning for every event, naming what happened to the node.

    When ``[action_log] record_file`` is set, also appends one JSON line per
    event to that file. A line is written only if no line with the same
    ``event_id`` is there yet, so handling an event twice records it once.
    """

    name = "log"

    def __init__(self, conf: cfg.ConfigOpts) -> None:
        super().__init__(conf)
        action_log_conf.register_opts(conf)

    def _handle(self, event: RevocationEvent) -> None:
        what = event.type.removeprefix("node.")
        LOG.warning(
            "Node %s %s (%s): %s", event.node_uuid, what, event.reason, event.detail
        )
        path = self.conf.action_log.record_file
        if not path:
            return
        record = {
            "event_id": event.id,
            "node_uuid": event.node_uuid,
            "type": event.type,
            "reason": event.reason,
            "detail": event.detail,
            "created_at": event.created_at,
            "action": self.name,
        }
        _jsonl.append(path, record, unless=lambda r: r.get("event_id") == event.id)
