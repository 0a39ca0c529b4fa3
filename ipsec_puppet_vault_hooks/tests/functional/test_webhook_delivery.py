"""Webhook delivery end to end: the verifier's outbox and ``webhook``
notifier against a real ``trusted-revocation-listener`` process (mTLS)."""

from __future__ import annotations

import tempfile
import uuid as uuid_mod

import testtools
from cryptography.hazmat.primitives.asymmetric import ed25519

from trusted_testing.cluster import wait_until
from trusted_testing.revocation import Pipeline
from verifier.exceptions import ConfigError
from verifier.notify import load_notifiers
from verifier.protocol import RevocationEvent


class WebhookDeliveryTest(testtools.TestCase):
    """One listener process for the class; each test uses its own nodes."""

    pipeline: Pipeline

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls._tmp = tempfile.TemporaryDirectory(prefix="trusted-webhook-")
        cls.pipeline = Pipeline(cls._tmp.name)
        try:
            cls.pipeline.start_listener(["webhook"])
        except Exception:
            cls.pipeline.close()
            cls._tmp.cleanup()
            raise

    @classmethod
    def tearDownClass(cls) -> None:
        cls.pipeline.close()
        cls._tmp.cleanup()
        super().tearDownClass()

    def setUp(self) -> None:
        super().setUp()
        p = self.pipeline
        if p.listener is None or p.listener.poll() is not None:
            p.start_listener(["webhook"])
        # Each test starts with nothing pending from another test.
        outbox = p.outbox(["webhook"])
        wait_until(lambda: outbox.dispatch_once(1000) >= 0 and not p.undelivered(), 30)

    def stats(self) -> dict[str, int]:
        answer = self.pipeline.session().get(self.pipeline.webhook_url + "/v1/stats")
        self.assertEqual(200, answer.status_code)
        return dict(answer.json())

    def recorded(self, event_id: str) -> int:
        return sum(r["event_id"] == event_id for r in self.pipeline.records())

    def test_delivered_after_the_actions_ran(self) -> None:
        p = self.pipeline
        signed = p.revoke(str(uuid_mod.uuid4()))
        outbox = p.outbox(["webhook"])
        self.assertEqual(1, outbox.dispatch_once())
        # The 2xx came after the log action wrote its record.
        self.assertEqual(1, self.recorded(signed.event.id))
        (entry,) = [
            e
            for e in outbox.list(signed.event.node_uuid)
            if e["signed_event"]["event"]["id"] == signed.event.id
        ]
        self.assertTrue(entry["delivered"])
        # A redelivery (e.g. after a verifier crash before it marked the
        # event) is deduplicated by the listener: the action ran once.
        answer = p.session().post(p.webhook_url + "/v1/events", json=signed.to_dict())
        self.assertEqual(200, answer.status_code)
        self.assertTrue(answer.json()["duplicate"])
        self.assertEqual(1, self.recorded(signed.event.id))

    def test_listener_down_then_back_and_verifier_restart(self) -> None:
        p = self.pipeline
        p.stop_listener()
        events = [p.revoke(str(uuid_mod.uuid4())) for _ in range(3)]
        outbox = p.outbox(["webhook"], retry_delay=0.0)
        self.assertEqual(0, outbox.dispatch_once())
        listed = {
            e["signed_event"]["event"]["id"]: e
            for e in outbox.list()
            if not e["delivered"]
        }
        for signed in events:
            self.assertIn(signed.event.id, listed)
            self.assertEqual(1, listed[signed.event.id]["attempts"])
            self.assertIn(
                "webhook https://127.0.0.1", listed[signed.event.id]["last_error"]
            )
        # The verifier restarts (a new outbox on the same database) and the
        # listener comes back: every event flows, none lost, none twice.
        outbox.close()
        p.start_listener(["webhook"])
        restarted = p.outbox(["webhook"])
        self.assertEqual(3, restarted.dispatch_once())
        self.assertEqual(0, p.undelivered())
        for signed in events:
            self.assertEqual(1, self.recorded(signed.event.id))

    def test_backoff_between_failed_tries(self) -> None:
        p = self.pipeline
        p.stop_listener()
        p.revoke(str(uuid_mod.uuid4()))
        outbox = p.outbox(["webhook"], retry_delay=3600.0)
        self.assertEqual(0, outbox.dispatch_once())
        p.start_listener(["webhook"])
        # Backing off: the next pass does not try the event yet.
        self.assertEqual(0, outbox.dispatch_once())
        self.assertEqual(1, p.undelivered())

    def test_bad_input_is_answered_and_counted(self) -> None:
        p = self.pipeline
        s = p.session()
        before = self.stats()
        url = p.webhook_url + "/v1/events"

        answer = s.post(url, data=b"{not json", headers={"Content-Type": "x"})
        self.assertEqual(400, answer.status_code)
        self.assertEqual("bad_json", answer.json()["error"]["code"])

        answer = s.post(url, json={"event": {"id": "x"}})
        self.assertEqual(400, answer.status_code)
        self.assertEqual("malformed", answer.json()["error"]["code"])

        forged = RevocationEvent(
            str(uuid_mod.uuid4()),
            str(uuid_mod.uuid4()),
            "pcr_policy",
            "forged",
            "2026-11-22T05:00:00Z",
        )
        signed = forged.sign(ed25519.Ed25519PrivateKey.generate())
        answer = s.post(url, json=signed.to_dict())
        self.assertEqual(422, answer.status_code)
        self.assertEqual("event_signature", answer.json()["error"]["code"])
        self.assertEqual(0, self.recorded(forged.id))

        # A client outside webhook_clients may not post at all.
        answer = p.session("intruder").post(url, json=signed.to_dict())
        self.assertEqual(403, answer.status_code)

        after = self.stats()
        self.assertEqual(before["malformed"] + 2, after["malformed"])
        self.assertEqual(before["bad_signature"] + 1, after["bad_signature"])
        # Still serving.
        good = p.revoke(str(uuid_mod.uuid4()))
        self.assertEqual(200, s.post(url, json=good.to_dict()).status_code)
        self.assertEqual(1, self.recorded(good.event.id))

    def test_configuration_errors_are_named(self) -> None:
        conf = self.pipeline.verifier_conf(["webhook"])
        conf.set_override("urls", ["http://127.0.0.1:1/"], group="notifier_webhook")
        key = self.pipeline.signing_key.public_key()
        error = self.assertRaises(ConfigError, load_notifiers, conf, ["webhook"], key)
        self.assertIn("is not an https:// URL", str(error))
        conf.set_override("urls", [], group="notifier_webhook")
        error = self.assertRaises(ConfigError, load_notifiers, conf, ["webhook"], key)
        self.assertIn("[notifier_webhook] urls is empty", str(error))
