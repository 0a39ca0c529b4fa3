"""Tests of the listener's event handler and messaging endpoint."""

from __future__ import annotations

import os

import fixtures
from cryptography.hazmat.primitives.asymmetric import ed25519
from oslotest import base

from ipsec_puppet_vault_hooks import Consumer, DedupStore
from ipsec_puppet_vault_hooks.listener import (
    HANDLED,
    REQUEUE,
    EventHandler,
    MessagingEndpoint,
)
from ipsec_puppet_vault_hooks.tests.unit import utils


class MessagingEndpointTest(base.BaseTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.key = ed25519.Ed25519PrivateKey.generate()
        self.action = utils.RecordingAction()
        self.tmp = self.useFixture(fixtures.TempDir()).path

    def endpoint(self, dedup: DedupStore | None = None) -> MessagingEndpoint:
        consumer = Consumer([self.key.public_key()], [self.action], dedup=dedup)
        self.handler = EventHandler(consumer)
        return MessagingEndpoint(self.handler)

    def warn(self, endpoint: MessagingEndpoint, payload: object) -> str:
        return endpoint.warn(
            {}, "trusted-verifier.h", "trusted.node.revoked", payload, {}
        )

    def test_handled_once_then_duplicate(self) -> None:
        endpoint = self.endpoint()
        signed = utils.make_event(self.key)
        self.assertEqual(HANDLED, self.warn(endpoint, signed.to_dict()))
        self.assertEqual(HANDLED, self.warn(endpoint, signed.to_dict()))
        self.assertEqual([signed.event.id], self.action.handled)
        self.assertEqual(1, self.handler.stats.handled)
        self.assertEqual(1, self.handler.stats.duplicates)

    def test_bad_input_is_acknowledged_and_counted(self) -> None:
        endpoint = self.endpoint()
        forged = utils.make_event(ed25519.Ed25519PrivateKey.generate())
        self.assertEqual(HANDLED, self.warn(endpoint, forged.to_dict()))
        self.assertEqual(HANDLED, self.warn(endpoint, {"event": 1}))
        self.assertEqual(HANDLED, self.warn(endpoint, "not an object"))
        self.assertEqual(1, self.handler.stats.bad_signature)
        self.assertEqual(2, self.handler.stats.malformed)
        self.assertEqual([], self.action.handled)

    def test_state_failure_requeues(self) -> None:
        path = os.path.join(self.tmp, "missing-dir", "processed.jsonl")
        endpoint = self.endpoint(DedupStore(path))
        signed = utils.make_event(self.key)
        self.assertEqual(REQUEUE, self.warn(endpoint, signed.to_dict()))
        self.assertEqual(1, self.handler.stats.state_errors)
