"""Messaging delivery end to end: the verifier's outbox and ``messaging``
notifier, a private RabbitMQ node (killed and restarted here; the shared
broker is never touched) and a ``trusted-revocation-listener`` process."""

from __future__ import annotations

import tempfile
import uuid as uuid_mod

import testtools
from cryptography.hazmat.primitives.asymmetric import ed25519

from trusted_testing.cluster import wait_until
from trusted_testing.rabbitmq import PrivateRabbit
from trusted_testing.revocation import Pipeline
from verifier.exceptions import ConfigError
from verifier.notify import load_notifiers
from verifier.protocol import RevocationEvent


class MessagingDeliveryTest(testtools.TestCase):
    """One private broker and one listener for the class."""

    rabbit: PrivateRabbit
    pipeline: Pipeline

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls._tmp = tempfile.TemporaryDirectory(prefix="trusted-messaging-")
        cls.rabbit = PrivateRabbit()
        try:
            cls.rabbit.start()
            cls.pipeline = Pipeline(
                cls._tmp.name, cls.rabbit.url, f"revocation_{uuid_mod.uuid4().hex[:8]}"
            )
        except Exception:
            cls.rabbit.cleanup()
            cls._tmp.cleanup()
            raise

    @classmethod
    def tearDownClass(cls) -> None:
        cls.pipeline.close()
        cls.rabbit.cleanup()
        cls._tmp.cleanup()
        super().tearDownClass()

    def setUp(self) -> None:
        super().setUp()
        if not self.rabbit.running:
            self.rabbit.start()
        p = self.pipeline
        if p.listener is None or p.listener.poll() is not None:
            p.start_listener(["messaging", "webhook"])

    def outbox(self):  # type: ignore[no-untyped-def]
        outbox = self.pipeline.outbox(["messaging"])
        self.addCleanup(outbox.close)
        return outbox

    def recorded(self, event_id: str) -> int:
        return sum(r["event_id"] == event_id for r in self.pipeline.records())

    def wait_recorded(self, ids: list[str]) -> None:
        wait_until(lambda: all(self.recorded(i) for i in ids), 60)
        for event_id in ids:
            self.assertEqual(1, self.recorded(event_id), event_id)

    def stats(self) -> dict[str, int]:
        p = self.pipeline
        return dict(p.session().get(p.webhook_url + "/v1/stats").json())

    def test_events_survive_a_broker_crash_before_any_consumer(self) -> None:
        p = self.pipeline
        p.stop_listener()
        events = [p.revoke(str(uuid_mod.uuid4())) for _ in range(3)]
        outbox = self.outbox()
        # Confirmed by the broker: delivered as far as the verifier goes.
        self.assertEqual(3, outbox.dispatch_once())
        self.assertEqual(0, p.undelivered())
        # The broker crashes before anyone consumed them, and comes back.
        self.rabbit.kill()
        self.rabbit.start()
        p.start_listener(["messaging", "webhook"])
        self.wait_recorded([e.event.id for e in events])

    def test_broker_outage_keeps_events_in_the_outbox(self) -> None:
        p = self.pipeline
        before = [p.revoke(str(uuid_mod.uuid4()))]
        outbox = self.outbox()
        self.assertEqual(1, outbox.dispatch_once())
        self.wait_recorded([before[0].event.id])

        self.rabbit.kill()
        during = [p.revoke(str(uuid_mod.uuid4())) for _ in range(3)]
        self.assertEqual(0, outbox.dispatch_once())
        pending = {
            e["signed_event"]["event"]["id"]: e
            for e in outbox.list()
            if not e["delivered"]
        }
        for signed in during:
            self.assertIn(
                "messaging: the broker did not take the event",
                pending[signed.event.id]["last_error"],
            )
        # The broker returns; the same verifier (and the listener, which
        # reconnects by itself) carry on: every event flows exactly once.
        self.rabbit.start()
        wait_until(lambda: outbox.dispatch_once() >= 0 and not p.undelivered(), 60)
        self.wait_recorded([e.event.id for e in during])

    def test_redelivered_event_runs_the_actions_once(self) -> None:
        p = self.pipeline
        signed = p.revoke(str(uuid_mod.uuid4()))
        # The verifier published, then crashed before marking it delivered:
        # after its restart it publishes the event again.
        first = self.outbox()
        first.dispatch_once()
        self.wait_recorded([signed.event.id])
        stats = self.stats()
        notifier = load_notifiers(
            p.verifier_conf(["messaging"]), ["messaging"], p.signing_key.public_key()
        )[0]
        self.addCleanup(notifier.close)
        self.assertTrue(notifier.deliver(signed.to_dict()))
        wait_until(lambda: self.stats()["duplicates"] > stats["duplicates"], 60)
        self.assertEqual(1, self.recorded(signed.event.id))

    def test_forged_and_malformed_notifications_are_counted_and_dropped(self) -> None:
        p = self.pipeline
        stats = self.stats()
        notifier = load_notifiers(
            p.verifier_conf(["messaging"]), ["messaging"], p.signing_key.public_key()
        )[0]
        self.addCleanup(notifier.close)
        forged = RevocationEvent(
            str(uuid_mod.uuid4()),
            str(uuid_mod.uuid4()),
            "pcr_policy",
            "forged",
            "2026-11-22T05:00:00Z",
        ).sign(ed25519.Ed25519PrivateKey.generate())
        notifier.deliver(forged.to_dict())
        notifier.deliver({"event": {"type": "node.revoked"}, "signature": "x"})
        wait_until(
            lambda: (
                self.stats()["bad_signature"] > stats["bad_signature"]
                and self.stats()["malformed"] > stats["malformed"]
            ),
            60,
        )
        # The listener goes on: a genuine event still gets through.
        good = p.revoke(str(uuid_mod.uuid4()))
        self.outbox().dispatch_once()
        self.wait_recorded([good.event.id])
        self.assertEqual(0, self.recorded(forged.event.id))

    def test_transient_queues_are_refused(self) -> None:
        conf = self.pipeline.verifier_conf(["messaging"], durable=False)
        error = self.assertRaises(
            ConfigError,
            load_notifiers,
            conf,
            ["messaging"],
            self.pipeline.signing_key.public_key(),
        )
        self.assertIn("amqp_durable_queues", str(error))
