"""The ``inprocess`` driver of the verifier's notifiers (stevedore group
``verifier.notifiers``, registered by this package): runs the revocation
consumer inside the verifier process, the embedded default. The verifier
knows it only by its entry point name; it implements the public
:class:`verifier.common.plugins.Notifier` interface."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ed25519
from oslo_config import cfg

from ipsec_puppet_vault_hooks.consumer import Consumer
from ipsec_puppet_vault_hooks.exceptions import HooksError
from verifier.common.plugins import Notifier, NotifierError

__all__ = ["InProcessNotifier"]


class InProcessNotifier(Notifier):
    """Runs the revocation consumer (``ipsec_puppet_vault_hooks``) inside
    the verifier process: the embedded default."""

    name = "inprocess"

    def __init__(self, conf: cfg.ConfigOpts, public_key: ed25519.Ed25519PublicKey):
        super().__init__(conf, public_key)
        # processed ids in [revocation_hooks] state_dir: after a crash of
        # the verifier between running the actions and marking the event
        # delivered, the outbox delivers it again and the actions do not
        # run twice
        self.consumer = Consumer.from_conf(conf, public_key=public_key)

    def _deliver(self, event: Mapping[str, Any]) -> bool:
        try:
            return self.consumer.consume(event).acked
        except HooksError as exc:
            raise NotifierError(f"inprocess: {exc}") from exc
