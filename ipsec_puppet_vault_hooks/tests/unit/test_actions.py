"""Tests of the action base class, the shipped drivers and their loading."""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os

import fixtures
from cryptography.hazmat.primitives.asymmetric import ed25519
from oslo_config import cfg
from oslotest import base

from ipsec_puppet_vault_hooks import ActionError, HooksError, load_actions
from ipsec_puppet_vault_hooks.actions.base import Action
from ipsec_puppet_vault_hooks.actions.log import LogAction
from ipsec_puppet_vault_hooks.actions.noop import NoopAction
from ipsec_puppet_vault_hooks.consumer import ACTIONS_NAMESPACE
from trusted_testing import hooks_events as utils
from verifier.protocol import RevocationEvent


class ActionBaseTestCase(base.BaseTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.event = utils.make_event(ed25519.Ed25519PrivateKey.generate()).event

    def test_failure_is_wrapped_in_action_error(self) -> None:
        action = utils.BrokenAction("x")
        exc = self.assertRaises(ActionError, action.handle, self.event)
        self.assertEqual("x", exc.action)
        self.assertEqual(self.event.id, exc.event_id)
        self.assertIn("RuntimeError", exc.detail)
        self.assertIsInstance(exc.__cause__, RuntimeError)

    def test_action_error_passes_through(self) -> None:
        error = ActionError("y", self.event.id, "explicit")

        class Raising(Action):
            name = "y"

            def _handle(self, event: RevocationEvent) -> None:
                raise error

        exc = self.assertRaises(
            ActionError, Raising(cfg.ConfigOpts()).handle, self.event
        )
        self.assertIs(error, exc)

    def test_noop(self) -> None:
        NoopAction(cfg.ConfigOpts()).handle(self.event)


class LogActionTestCase(base.BaseTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.conf = cfg.ConfigOpts()
        self.tmp = self.useFixture(fixtures.TempDir()).path
        self.logger = self.useFixture(fixtures.FakeLogger(level=logging.WARNING))
        self.key = ed25519.Ed25519PrivateKey.generate()

    def test_logs_warning_without_record_file(self) -> None:
        event = utils.make_event(self.key).event
        LogAction(self.conf).handle(event)
        self.assertIn(
            f"Node {event.node_uuid} revoked (pcr_policy)", self.logger.output
        )
        self.assertIn(event.detail, self.logger.output)

    def test_writes_one_record_per_event_even_when_handled_twice(self) -> None:
        path = os.path.join(self.tmp, "revocations.jsonl")
        action = LogAction(self.conf)
        self.conf.set_override("record_file", path, group="action_log")
        first = utils.make_event(self.key).event
        second = utils.make_event(self.key).event
        action.handle(first)
        action.handle(first)
        action.handle(second)
        LogAction(self.conf).handle(first)  # a new instance, same file

        with open(path) as f:
            records = [json.loads(line) for line in f]
        self.assertEqual([first.id, second.id], [r["event_id"] for r in records])
        self.assertEqual(
            {
                "event_id": first.id,
                "node_uuid": first.node_uuid,
                "type": "node.revoked",
                "reason": first.reason,
                "detail": first.detail,
                "created_at": first.created_at,
                "action": "log",
            },
            records[0],
        )

    def test_torn_last_line_does_not_corrupt_next_record(self) -> None:
        path = os.path.join(self.tmp, "revocations.jsonl")
        with open(path, "w") as f:
            f.write('{"event_id": "trunc')
        action = LogAction(self.conf)
        self.conf.set_override("record_file", path, group="action_log")
        event = utils.make_event(self.key).event
        action.handle(event)
        with open(path) as f:
            lines = f.read().splitlines()
        self.assertEqual(event.id, json.loads(lines[-1])["event_id"])

    def test_unwritable_record_file_raises_action_error(self) -> None:
        action = LogAction(self.conf)
        self.conf.set_override(
            "record_file", os.path.join(self.tmp, "no", "such.jsonl"), "action_log"
        )
        exc = self.assertRaises(
            ActionError, action.handle, utils.make_event(self.key).event
        )
        self.assertEqual("log", exc.action)


class LoadActionsTestCase(base.BaseTestCase):
    def test_unknown_action_is_named(self) -> None:
        exc = self.assertRaises(
            HooksError, load_actions, cfg.ConfigOpts(), ["no-such-action"]
        )
        self.assertIn("no-such-action", str(exc))

    def test_duplicate_name_rejected(self) -> None:
        exc = self.assertRaises(
            HooksError, load_actions, cfg.ConfigOpts(), ["noop", "noop"]
        )
        self.assertIn("noop", str(exc))

    def test_no_names(self) -> None:
        self.assertEqual([], load_actions(cfg.ConfigOpts(), []))

    def test_load_log_and_noop_by_name(self) -> None:
        if not importlib.metadata.entry_points(group=ACTIONS_NAMESPACE):
            self.skipTest(
                f"entry points of {ACTIONS_NAMESPACE} are not installed "
                "(run `pip install -e .` to enable this test)"
            )
        conf = cfg.ConfigOpts()
        actions = load_actions(conf, ["log", "noop"])
        self.assertEqual(["log", "noop"], [a.name for a in actions])
        self.assertIsInstance(actions[0], LogAction)
        self.assertIsInstance(actions[1], NoopAction)
        self.assertIs(conf, actions[0].conf)
