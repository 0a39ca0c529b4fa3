"""Revocation hooks: act on signed node-revocation events.

The verifier signs a :class:`~verifier.protocol.RevocationEvent` whenever a
node stops being trusted. A :class:`Consumer` verifies those events against
the verifier's Ed25519 key and runs the configured :class:`Action` drivers
(tear down IPsec tunnels, revoke Puppet certificates, revoke Vault tokens,
...) exactly once per event, with retries and dead letters.
"""

from ipsec_puppet_vault_hooks.actions.base import Action
from ipsec_puppet_vault_hooks.consumer import (
    Consumer,
    ConsumeResult,
    DeadLetter,
    DeadLetterStore,
    DedupStore,
    load_actions,
)
from ipsec_puppet_vault_hooks.exceptions import (
    ActionError,
    EventRejectedError,
    HooksError,
)
from ipsec_puppet_vault_hooks.keys import load_public_key

__all__ = [
    "Action",
    "ActionError",
    "ConsumeResult",
    "Consumer",
    "DeadLetter",
    "DeadLetterStore",
    "DedupStore",
    "EventRejectedError",
    "HooksError",
    "load_actions",
    "load_public_key",
]
