"""Tests of the listener's event handler and messaging endpoint."""

from __future__ import annotations

import os

import fixtures
from cryptography.hazmat.primitives.asymmetric import ed25519
from oslotest import base

from ipsec_puppet_vault_hooks import Consumer, DedupStore
from ipsec_puppet_vault_hooks.listener import EventHandler
from ipsec_puppet_vault_hooks.messaging import HANDLED, REQUEUE, MessagingEndpoint
from trusted_testing import hooks_events as utils


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


class RedriveTest(base.BaseTestCase):
    def test_dead_letters_are_redriven_until_they_succeed(self) -> None:
        key = ed25519.Ed25519PrivateKey.generate()
        tmp = self.useFixture(fixtures.TempDir()).path
        down = utils.RecordingAction("target", failures=5)
        fine = utils.RecordingAction("fine")
        consumer = Consumer([key.public_key()], [down, fine], max_attempts=2)
        redriven = os.path.join(tmp, "redriven.jsonl")
        handler = EventHandler(consumer, redriven)
        signed = utils.make_event(key)
        result = handler.handle(signed.to_dict())
        self.assertEqual(("target",), result.dead_lettered)
        self.assertEqual([signed.event.id], fine.handled)

        self.assertEqual(0, handler.redrive())  # target still down (call 3)
        self.assertEqual(0, handler.redrive())  # call 4
        self.assertEqual(0, handler.redrive())  # call 5
        self.assertEqual(1, handler.redrive())  # back: done
        self.assertEqual([signed.event.id], down.handled)
        self.assertEqual(0, handler.redrive())  # not tried again
        self.assertEqual(1, handler.stats.redriven)
        # A restarted listener remembers what it redrove.
        again = EventHandler(consumer, redriven)
        self.assertEqual(0, again.redrive())
        self.assertEqual([signed.event.id], down.handled)
        # The other action was never run twice.
        self.assertEqual([signed.event.id], fine.handled)
