"""Tests of :mod:`ipsec_puppet_vault_hooks.consumer`."""

from __future__ import annotations

import base64
import json
import os
import uuid

import fixtures
from cryptography.hazmat.primitives.asymmetric import ed25519
from oslo_config import cfg
from oslotest import base

from ipsec_puppet_vault_hooks import (
    Consumer,
    ConsumeResult,
    DeadLetterStore,
    DedupStore,
    EventRejectedError,
    HooksError,
)
from ipsec_puppet_vault_hooks.conf import revocation_hooks as hooks_conf
from trusted_testing import hooks_events as utils
from verifier.protocol import RevocationEvent, SignedEvent
from verifier.protocol.events import (
    NODE_FAILED,
    NODE_HOST_UNTRUSTED,
    NODE_POLICY_CHANGED,
    NODE_RECOVERED,
    NODE_UNREACHABLE,
)


class ConsumerTestCase(base.BaseTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.key = ed25519.Ed25519PrivateKey.generate()
        self.first = utils.RecordingAction("first")
        self.second = utils.RecordingAction("second")
        self.sleeps: list[float] = []
        self.tmp = self.useFixture(fixtures.TempDir()).path

    def _consumer(self, *actions: utils.RecordingAction, **kwargs: object) -> Consumer:
        kwargs.setdefault("sleep", self.sleeps.append)
        return Consumer(
            [self.key.public_key()],
            list(actions) or [self.first, self.second],
            **kwargs,  # type: ignore[arg-type]
        )

    def test_valid_event_runs_all_actions_and_is_acked(self) -> None:
        signed = utils.make_event(self.key)
        result = self._consumer().consume(signed.to_dict())
        self.assertEqual(ConsumeResult(signed.event.id, acked=True), result)
        self.assertEqual([signed.event.id], self.first.handled)
        self.assertEqual([signed.event.id], self.second.handled)

    def _failed_event(self, kind: str = NODE_FAILED) -> SignedEvent:
        return RevocationEvent(
            str(uuid.uuid4()),
            str(uuid.uuid4()),
            "unreachable",
            "agent unreachable: connection refused",
            "2024-05-01T12:00:00Z",
            kind,
        ).sign(self.key)

    def test_unreachable_event_runs_no_revocation_action(self) -> None:
        # An agent restart or a reboot must not cut a healthy node off:
        # only the unreachable_actions run (the log, from configuration).
        only_log = utils.RecordingAction("log")
        consumer = self._consumer(unreachable_actions=[only_log])
        signed = self._failed_event(NODE_UNREACHABLE)
        self.assertTrue(consumer.consume(signed.to_dict()).acked)
        self.assertEqual([signed.event.id], only_log.handled)
        self.assertEqual([], self.first.handled)
        self.assertEqual([], self.second.handled)

    def test_policy_changed_event_runs_no_action(self) -> None:
        # a new policy in force on a node takes nothing away
        consumer = self._consumer()
        signed = self._failed_event(NODE_POLICY_CHANGED)
        result = consumer.consume(signed.to_dict())
        self.assertTrue(result.acked)
        self.assertFalse(result.duplicate)
        self.assertEqual([], self.first.handled)
        self.assertEqual([], self.second.handled)

    def test_recovered_event_runs_only_the_recovered_actions(self) -> None:
        consumer = self._consumer()  # none by default
        signed = self._failed_event(NODE_RECOVERED)
        self.assertTrue(consumer.consume(signed.to_dict()).acked)
        self.assertEqual([], self.first.handled)

    def test_unreachable_and_recovered_actions_come_from_configuration(self) -> None:
        conf = cfg.ConfigOpts()
        hooks_conf.register_opts(conf)
        conf([], default_config_files=[])
        self.assertEqual(["log"], conf.revocation_hooks.unreachable_actions)
        self.assertEqual(["log"], conf.revocation_hooks.recovered_actions)

    def test_failed_event_runs_the_revocation_actions_by_default(self) -> None:
        # Fail closed (issue 18): a node the verifier no longer vouches for
        # is cut off like a revoked one unless the operator says otherwise.
        signed = self._failed_event()
        self.assertTrue(self._consumer().consume(signed.to_dict()).acked)
        self.assertEqual([signed.event.id], self.first.handled)
        self.assertEqual([signed.event.id], self.second.handled)

    def test_failed_event_runs_only_the_failed_actions_when_set(self) -> None:
        only_log = utils.RecordingAction("log")
        consumer = self._consumer(failed_actions=[only_log])
        signed = self._failed_event()
        self.assertTrue(consumer.consume(signed.to_dict()).acked)
        self.assertEqual([signed.event.id], only_log.handled)
        self.assertEqual([], self.first.handled)
        revoked = utils.make_event(self.key)
        consumer.consume(revoked.to_dict())
        self.assertEqual([revoked.event.id], self.first.handled)
        self.assertEqual([signed.event.id], only_log.handled)

    def test_host_untrusted_event_runs_the_revocation_actions_by_default(
        self,
    ) -> None:
        # a guest whose compute host was found untrusted is compromised
        signed = self._failed_event(NODE_HOST_UNTRUSTED)
        self.assertTrue(self._consumer().consume(signed.to_dict()).acked)
        self.assertEqual([signed.event.id], self.first.handled)
        self.assertEqual([signed.event.id], self.second.handled)

    def test_host_untrusted_actions_come_from_configuration(self) -> None:
        conf = cfg.ConfigOpts()
        hooks_conf.register_opts(conf)
        conf([], default_config_files=[])
        self.assertIsNone(conf.revocation_hooks.host_untrusted_actions)
        only_log = utils.RecordingAction("log")
        consumer = self._consumer(host_untrusted_actions=[only_log])
        signed = self._failed_event(NODE_HOST_UNTRUSTED)
        self.assertTrue(consumer.consume(signed.to_dict()).acked)
        self.assertEqual([signed.event.id], only_log.handled)
        self.assertEqual([], self.first.handled)

    def test_accepts_parsed_signed_event(self) -> None:
        signed = utils.make_event(self.key)
        self.assertTrue(self._consumer().consume(signed).acked)
        self.assertEqual([signed.event.id], self.first.handled)

    def test_event_with_forged_signature_is_rejected_and_runs_no_action(
        self,
    ) -> None:
        data = utils.make_event(self.key).to_dict()
        data["event"]["detail"] = "tampered"
        consumer = self._consumer()
        exc = self.assertRaises(EventRejectedError, consumer.consume, data)
        self.assertEqual("event_signature", exc.reason)
        self.assertEqual([], self.first.handled)
        self.assertEqual([], self.second.handled)
        self.assertEqual(0, len(consumer.dedup))

    def test_forged_signature_bytes_rejected(self) -> None:
        data = utils.make_event(self.key).to_dict()
        data["signature"] = base64.b64encode(b"\x00" * 64).decode()
        exc = self.assertRaises(EventRejectedError, self._consumer().consume, data)
        self.assertEqual("event_signature", exc.reason)
        self.assertEqual([], self.first.handled)

    def test_event_signed_by_unknown_key_is_rejected(self) -> None:
        other = ed25519.Ed25519PrivateKey.generate()
        data = utils.make_event(other).to_dict()
        exc = self.assertRaises(EventRejectedError, self._consumer().consume, data)
        self.assertEqual("event_signature", exc.reason)
        self.assertIn("unknown key", exc.detail)
        self.assertEqual([], self.first.handled)

    def test_unknown_key_with_forged_key_id_is_rejected(self) -> None:
        other = ed25519.Ed25519PrivateKey.generate()
        data = utils.make_event(other).to_dict()
        data["key_id"] = utils.make_event(self.key).key_id
        exc = self.assertRaises(EventRejectedError, self._consumer().consume, data)
        self.assertEqual("event_signature", exc.reason)
        self.assertEqual([], self.first.handled)

    def test_any_configured_key_is_accepted(self) -> None:
        other = ed25519.Ed25519PrivateKey.generate()
        consumer = Consumer([other.public_key(), self.key.public_key()], [self.first])
        self.assertTrue(consumer.consume(utils.make_event(self.key).to_dict()).acked)
        self.assertTrue(consumer.consume(utils.make_event(other).to_dict()).acked)
        self.assertEqual(2, len(self.first.handled))

    def test_malformed_dict_is_rejected(self) -> None:
        good = utils.make_event(self.key).to_dict()
        no_field = json.loads(json.dumps(good))
        del no_field["event"]["reason"]
        bad_uuid = json.loads(json.dumps(good))
        bad_uuid["event"]["node_uuid"] = "not-a-uuid"
        bad_b64 = dict(good, signature="***")
        for data in ({}, "junk", no_field, bad_uuid, bad_b64, dict(good, key_id=1)):
            exc = self.assertRaises(
                EventRejectedError,
                self._consumer().consume,
                data,
            )
            self.assertEqual("malformed", exc.reason)
        self.assertEqual([], self.first.handled)

    def test_duplicate_delivery_runs_actions_once(self) -> None:
        data = utils.make_event(self.key).to_dict()
        consumer = self._consumer()
        self.assertFalse(consumer.consume(data).duplicate)
        again = consumer.consume(data)
        self.assertTrue(again.acked)
        self.assertTrue(again.duplicate)
        self.assertEqual(1, len(self.first.handled))
        self.assertEqual(1, len(self.second.handled))

    def test_duplicate_across_restart_with_file_dedup(self) -> None:
        path = os.path.join(self.tmp, "seen.jsonl")
        data = utils.make_event(self.key).to_dict()
        self._consumer(self.first, dedup=DedupStore(path)).consume(data)

        restarted = utils.RecordingAction("first")
        result = self._consumer(restarted, dedup=DedupStore(path)).consume(data)
        self.assertTrue(result.acked)
        self.assertTrue(result.duplicate)
        self.assertEqual(1, len(self.first.handled))
        self.assertEqual([], restarted.handled)

    def test_flaky_action_is_retried_and_succeeds(self) -> None:
        flaky = utils.RecordingAction("flaky", failures=2)
        signed = utils.make_event(self.key)
        consumer = self._consumer(flaky, max_attempts=3, retry_delay=0.5)
        result = consumer.consume(signed.to_dict())
        self.assertEqual((), result.dead_lettered)
        self.assertEqual(3, flaky.calls)
        self.assertEqual([signed.event.id], flaky.handled)
        self.assertEqual([0.5, 1.0], self.sleeps)
        self.assertEqual(0, len(consumer.dead_letters))

    def test_failing_action_is_dead_lettered_and_others_still_run(self) -> None:
        path = os.path.join(self.tmp, "dead.jsonl")
        broken = utils.BrokenAction()
        signed = utils.make_event(self.key)
        consumer = self._consumer(
            broken,
            self.second,
            max_attempts=3,
            retry_delay=1.0,
            dead_letters=DeadLetterStore(path),
        )
        result = consumer.consume(signed.to_dict())

        self.assertTrue(result.acked)
        self.assertEqual(("broken",), result.dead_lettered)
        self.assertEqual(3, broken.calls)
        self.assertEqual([1.0, 2.0], self.sleeps)
        self.assertEqual([signed.event.id], self.second.handled)
        self.assertIn(signed.event.id, consumer.dedup)

        # Persisted: a new store on the same file sees the record.
        (letter,) = list(DeadLetterStore(path))
        self.assertEqual("broken", letter.action)
        self.assertEqual(3, letter.attempts)
        self.assertEqual(signed.event.id, letter.event_id)
        self.assertEqual(signed.event.node_uuid, letter.event["node_uuid"])
        self.assertIn("transient failure 3", letter.error)
        with open(path) as f:
            self.assertEqual(1, len(f.readlines()))

    def test_single_attempt_does_not_sleep(self) -> None:
        broken = utils.BrokenAction()
        consumer = self._consumer(broken, max_attempts=1, retry_delay=5.0)
        result = consumer.consume(utils.make_event(self.key).to_dict())
        self.assertEqual(("broken",), result.dead_lettered)
        self.assertEqual(1, broken.calls)
        self.assertEqual([], self.sleeps)

    def test_bad_arguments(self) -> None:
        pub = self.key.public_key()
        self.assertRaises(HooksError, Consumer, [], [self.first])
        self.assertRaises(HooksError, Consumer, [pub], [self.first], max_attempts=0)
        self.assertRaises(HooksError, Consumer, [pub], [self.first], retry_delay=-1)
        # Names need a conf to be loaded with.
        self.assertRaises(HooksError, Consumer, [pub], ["log"])
        self.assertRaises(HooksError, Consumer, [pub], [object()])

    def test_unwritable_dedup_store_does_not_ack(self) -> None:
        path = os.path.join(self.tmp, "missing-dir", "seen.jsonl")
        consumer = self._consumer(dedup=DedupStore(path))
        self.assertRaises(
            HooksError, consumer.consume, utils.make_event(self.key).to_dict()
        )
