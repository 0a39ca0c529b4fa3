"""Notifier drivers shipped with the verifier."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ed25519
from oslo_config import cfg

import ipsec_puppet_vault_hooks as hooks
from ipsec_puppet_vault_hooks import conf as hooks_conf
from verifier.notify.base import Notifier, NotifierError


class NoopNotifier(Notifier):
    """Acknowledges every event and does nothing."""

    name = "noop"

    def _deliver(self, event: Mapping[str, Any]) -> bool:
        return True


class InProcessNotifier(Notifier):
    """Runs the revocation consumer (``ipsec_puppet_vault_hooks``) inside
    the verifier process: the embedded default."""

    name = "inprocess"

    def __init__(self, conf: cfg.ConfigOpts, public_key: ed25519.Ed25519PublicKey):
        super().__init__(conf, public_key)
        hooks_conf.register_opts(conf)
        group = conf.revocation_hooks
        self.consumer = hooks.Consumer(
            [public_key],
            hooks.load_actions(conf, group.actions),
            max_attempts=group.max_attempts,
            retry_delay=group.retry_delay,
        )

    def _deliver(self, event: Mapping[str, Any]) -> bool:
        try:
            return self.consumer.consume(event).acked
        except hooks.HooksError as exc:
            raise NotifierError(f"inprocess: {exc}") from exc
