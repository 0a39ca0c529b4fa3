"""The ``inprocess`` notifier remembers the events it handled across a
verifier restart (issue 18, crashes during revocation): the outbox delivers
an event again when the verifier died after the actions ran but before the
event was marked delivered, and the actions must not run twice."""

from __future__ import annotations

import os

import fixtures
from cryptography.hazmat.primitives.asymmetric import ed25519
from oslo_config import cfg
from oslotest import base

from ipsec_puppet_vault_hooks.inprocess import InProcessNotifier
from trusted_testing import hooks_events as utils


class InProcessRestartTest(base.BaseTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.tmp = self.useFixture(fixtures.TempDir()).path
        self.key = ed25519.Ed25519PrivateKey.generate()
        self.record = os.path.join(self.tmp, "actions.jsonl")

    def notifier(self, state_dir: str | None) -> InProcessNotifier:
        """A fresh notifier, as a restarted verifier loads it."""
        path = os.path.join(self.tmp, "verifier.conf")
        with open(path, "w", encoding="utf-8") as f:
            f.write("[revocation_hooks]\nactions = log\n")
            if state_dir:
                f.write(f"state_dir = {state_dir}\n")
            f.write(f"[action_log]\nrecord_file = {self.record}\n")
        conf = cfg.ConfigOpts()
        conf(["--config-file", path])
        return InProcessNotifier(conf, self.key.public_key())

    def test_event_delivered_again_after_a_restart_runs_the_actions_once(
        self,
    ) -> None:
        state = os.path.join(self.tmp, "state")
        event = utils.make_event(self.key).to_dict()
        first = self.notifier(state).consumer.consume(event)
        self.assertFalse(first.duplicate)
        # the verifier crashed before marking it delivered: a new process
        # delivers it again, and no action runs
        again = self.notifier(state)
        self.assertTrue(again.consumer.consume(event).duplicate)
        self.assertTrue(again.deliver(event))

    def test_without_state_dir_a_restart_forgets(self) -> None:
        # what state_dir is for: in memory only, a restart runs the actions
        # again (the log action's record file is idempotent by itself)
        event = utils.make_event(self.key).to_dict()
        self.notifier(None).deliver(event)
        self.assertFalse(self.notifier(None).consumer.consume(event).duplicate)
