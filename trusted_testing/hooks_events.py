"""Helpers for the unit tests: keys, events and fake actions."""

from __future__ import annotations

import uuid

from cryptography.hazmat.primitives.asymmetric import ed25519
from oslo_config import cfg

from ipsec_puppet_vault_hooks.actions.base import Action
from verifier.protocol import RevocationEvent, SignedEvent


def make_event(
    key: ed25519.Ed25519PrivateKey, event_id: str | None = None
) -> SignedEvent:
    return RevocationEvent(
        id=event_id or str(uuid.uuid4()),
        node_uuid=str(uuid.uuid4()),
        reason="pcr_policy",
        detail="PCR 7 does not match the policy",
        created_at="2024-05-01T12:00:00Z",
    ).sign(key)


class RecordingAction(Action):
    """Records the ids of the events it handled; fails ``failures`` times."""

    def __init__(self, name: str = "recording", failures: int = 0) -> None:
        super().__init__(cfg.ConfigOpts())
        self.name = name
        self.failures = failures
        self.calls = 0
        self.handled: list[str] = []

    def _handle(self, event: RevocationEvent) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise RuntimeError(f"transient failure {self.calls}")
        self.handled.append(event.id)


class BrokenAction(RecordingAction):
    """Always fails."""

    def __init__(self, name: str = "broken") -> None:
        super().__init__(name, failures=10**6)
