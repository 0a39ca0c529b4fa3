"""The transactional outbox of revocation events (``verifier.notify.Outbox``)."""

from __future__ import annotations

import json
import os
import tempfile
import uuid as uuid_mod
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
import testtools
from cryptography.hazmat.primitives.asymmetric import ed25519
from oslo_config import cfg
from sqlalchemy.orm import Session

from verifier.db import OutboxEvent, make_engine, upgrade
from verifier.notify import Notifier, NotifierError, Outbox
from verifier.notify.outbox import add_to_outbox, make_event
from verifier.protocol import SignedEvent


class RecordingNotifier(Notifier):
    """Records events; ``mode`` is "ack", "nack", "raise" or "notifier_error"."""

    def __init__(
        self, name: str, public_key: ed25519.Ed25519PublicKey, mode: str = "ack"
    ) -> None:
        super().__init__(cfg.ConfigOpts(), public_key)
        self.name = name
        self.mode = mode
        self.events: list[Mapping[str, Any]] = []

    def _deliver(self, event: Mapping[str, Any]) -> bool:
        self.events.append(event)
        if self.mode == "raise":
            raise ConnectionError("connection refused")
        if self.mode == "notifier_error":
            raise NotifierError(f"{self.name}: consumer said no")
        return self.mode == "ack"


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


class OutboxTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.engine = make_engine("sqlite:///" + os.path.join(tmp.name, "o.db"))
        self.addCleanup(self.engine.dispose)
        upgrade(self.engine)
        self.key = ed25519.Ed25519PrivateKey.generate()
        self.clock = Clock()
        self.node_a = str(uuid_mod.uuid4())
        self.node_b = str(uuid_mod.uuid4())

    def add_event(self, node_uuid: str, reason: str = "pcr_policy") -> SignedEvent:
        now = self.clock()
        signed = make_event(self.key, node_uuid, reason, "detail", now)
        with Session(self.engine) as session, session.begin():
            add_to_outbox(session, signed, now)
        return signed

    def rows(self) -> dict[str, OutboxEvent]:
        with Session(self.engine) as session:
            rows = list(session.scalars(sa.select(OutboxEvent)))
            for row in rows:
                session.expunge(row)
        return {row.id: row for row in rows}

    def notifier(self, name: str, mode: str = "ack") -> RecordingNotifier:
        return RecordingNotifier(name, self.key.public_key(), mode)

    def test_event_body_is_signed_wire_form(self) -> None:
        signed = self.add_event(self.node_a, "tenant_revoked")
        row = self.rows()[signed.event.id]
        parsed = SignedEvent.from_dict(json.loads(row.body))
        event = parsed.verify(self.key.public_key())
        self.assertEqual(signed.event, event)
        self.assertEqual(self.node_a, row.node_uuid)
        self.assertEqual(0, row.attempts)
        self.assertIsNone(row.delivered_at)

    def test_delivered_when_all_notifiers_ack(self) -> None:
        signed = self.add_event(self.node_a)
        first, second = self.notifier("one"), self.notifier("two")
        outbox = Outbox(self.engine, [first, second], clock=self.clock)
        self.assertEqual(1, outbox.dispatch_once())
        self.assertEqual([signed.to_dict()], first.events)
        self.assertEqual([signed.to_dict()], second.events)
        row = self.rows()[signed.event.id]
        self.assertEqual(self.clock.now, row.delivered_at)
        self.assertEqual(1, row.attempts)
        self.assertIsNone(row.last_error)
        self.assertEqual(0, outbox.dispatch_once())
        self.assertEqual(1, len(first.events))

    def test_not_delivered_unless_all_ack(self) -> None:
        signed = self.add_event(self.node_a)
        good = self.notifier("good")
        for mode, message in (
            ("nack", "bad: not acknowledged"),
            ("raise", "bad: connection refused"),
            ("notifier_error", "bad: consumer said no"),
        ):
            bad = self.notifier("bad", mode)
            outbox = Outbox(self.engine, [good, bad], clock=self.clock)
            self.assertEqual(0, outbox.dispatch_once(), mode)
            row = self.rows()[signed.event.id]
            self.assertIsNone(row.delivered_at, mode)
            self.assertIn(message, row.last_error)
            self.assertEqual(1, len(bad.events))
        row = self.rows()[signed.event.id]
        self.assertEqual(3, row.attempts)
        # At-least-once: the notifier that acked gets the event again.
        self.assertEqual(3, len(good.events))

        outbox = Outbox(self.engine, [good, self.notifier("fixed")], clock=self.clock)
        self.assertEqual(1, outbox.dispatch_once())
        row = self.rows()[signed.event.id]
        self.assertIsNotNone(row.delivered_at)
        self.assertEqual(4, row.attempts)
        self.assertIsNone(row.last_error)

    def test_errors_of_several_notifiers_are_all_recorded(self) -> None:
        signed = self.add_event(self.node_a)
        outbox = Outbox(
            self.engine,
            [self.notifier("n1", "nack"), self.notifier("n2", "raise")],
            clock=self.clock,
        )
        outbox.dispatch_once()
        error = self.rows()[signed.event.id].last_error
        self.assertIn("n1: not acknowledged", error)
        self.assertIn("n2: connection refused", error)

    def test_no_notifiers_delivers(self) -> None:
        self.add_event(self.node_a)
        self.assertEqual(1, Outbox(self.engine, []).dispatch_once())

    def test_delivery_in_creation_order_and_limit(self) -> None:
        events = [self.add_event(self.node_a) for _ in range(5)]
        recorder = self.notifier("rec")
        outbox = Outbox(self.engine, [recorder], clock=self.clock)
        self.assertEqual(2, outbox.dispatch_once(limit=2))
        self.assertEqual(3, outbox.dispatch_once())
        self.assertEqual(
            [e.event.id for e in events], [e["event"]["id"] for e in recorder.events]
        )

    def test_list_shows_delivery_state_and_filters_by_node(self) -> None:
        a1 = self.add_event(self.node_a, "pcr_policy")
        b1 = self.add_event(self.node_b, "malformed")
        picky = self.notifier("picky", "nack")
        outbox = Outbox(self.engine, [picky], clock=self.clock)
        outbox.dispatch_once()
        listed = outbox.list()
        self.assertEqual(
            [a1.event.id, b1.event.id],
            [e["signed_event"]["event"]["id"] for e in listed],
        )
        self.assertEqual([False, False], [e["delivered"] for e in listed])
        self.assertEqual([1, 1], [e["attempts"] for e in listed])

        a2 = self.add_event(self.node_a, "tenant_revoked")
        picky.mode = "ack"
        self.assertEqual(3, outbox.dispatch_once())
        a3 = self.add_event(self.node_a, "tenant_revoked")

        only_a = outbox.list(self.node_a)
        self.assertEqual(
            [a1.event.id, a2.event.id, a3.event.id],
            [e["signed_event"]["event"]["id"] for e in only_a],
        )
        self.assertEqual([True, True, False], [e["delivered"] for e in only_a])
        self.assertEqual([2, 1, 0], [e["attempts"] for e in only_a])
        self.assertEqual([None, None, None], [e["last_error"] for e in only_a])
        only_b = outbox.list(self.node_b)
        self.assertEqual([b1.to_dict()], [e["signed_event"] for e in only_b])
        self.assertEqual([], outbox.list(str(uuid_mod.uuid4())))

    def test_backoff_doubles_and_is_capped(self) -> None:
        signed = self.add_event(self.node_a)
        bad = self.notifier("bad", "nack")
        outbox = Outbox(
            self.engine, [bad], clock=self.clock, retry_delay=10.0, max_retry_delay=15.0
        )
        self.assertEqual(0, outbox.dispatch_once())  # try 1 fails: wait 10 s
        self.assertEqual(0, outbox.dispatch_once())  # too early: not tried
        self.assertEqual(1, len(bad.events))
        self.clock.now += 10
        outbox.dispatch_once()  # try 2 fails: wait min(20, 15) s
        self.assertEqual(2, len(bad.events))
        self.clock.now += 10
        outbox.dispatch_once()
        self.assertEqual(2, len(bad.events))
        self.clock.now += 5
        bad.mode = "ack"
        self.assertEqual(1, outbox.dispatch_once())
        self.assertEqual(3, self.rows()[signed.event.id].attempts)

    def test_a_notifier_that_acked_is_not_asked_again(self) -> None:
        self.add_event(self.node_a)
        good, flaky = self.notifier("good"), self.notifier("flaky", "raise")
        outbox = Outbox(self.engine, [good, flaky], clock=self.clock)
        self.assertEqual(0, outbox.dispatch_once())
        self.assertEqual(0, outbox.dispatch_once())
        flaky.mode = "ack"
        self.assertEqual(1, outbox.dispatch_once())
        self.assertEqual(1, len(good.events))
        self.assertEqual(3, len(flaky.events))


class EventRetentionTest(OutboxTest):
    """``[verifier] event_retention_days``: delivered events past it go;
    undelivered ones stay whatever their age."""

    def test_prune_deletes_only_delivered_events_older_than_the_cut(self) -> None:
        old_delivered = self.add_event(self.node_a)
        old_pending = self.add_event(self.node_b)
        cut = self.clock.now + 0.5
        young_delivered = self.add_event(self.node_a)
        with Session(self.engine) as session, session.begin():
            for signed in (old_delivered, young_delivered):
                row = session.get(OutboxEvent, signed.event.id)
                assert row is not None
                row.delivered_at = self.clock.now
        outbox = Outbox(self.engine, [], clock=self.clock)
        self.assertEqual(1, outbox.prune(cut))
        self.assertEqual(
            {old_pending.event.id, young_delivered.event.id}, set(self.rows())
        )
        self.assertEqual(0, outbox.prune(cut))  # nothing left to delete

    def test_pump_prunes_at_most_hourly_and_never_without_retention(self) -> None:
        from verifier.attest.delivery import PRUNE_EVERY, OutboxPump

        outbox = Outbox(self.engine, [self.notifier("a")], clock=self.clock)
        self.add_event(self.node_a)
        self.add_event(self.node_b)
        outbox.dispatch_once()  # both delivered
        now = [self.clock.now]
        day = 86400.0
        kept = OutboxPump(outbox, lambda _: True, 0.1, 0, lambda: now[0])
        pump = OutboxPump(outbox, lambda _: True, 0.1, 30, lambda: now[0])
        now[0] += 29 * day
        self.assertEqual(0, pump.prune_if_due())  # younger than 30 days
        self.assertEqual(2, len(self.rows()))
        now[0] += 2 * day
        self.assertEqual(0, kept.prune_if_due())  # 0: kept for ever
        self.assertEqual(2, len(self.rows()))
        self.assertEqual(2, pump.prune_if_due())
        self.assertEqual({}, self.rows())
        self.add_event(self.node_a)  # as old, delivered after the last pass
        outbox.dispatch_once()
        now[0] += PRUNE_EVERY - 1  # the last pass was under an hour ago
        self.assertEqual(0, pump.prune_if_due())
        self.assertEqual(1, len(self.rows()))
        now[0] += 1
        self.assertEqual(1, pump.prune_if_due())
        self.assertEqual({}, self.rows())
