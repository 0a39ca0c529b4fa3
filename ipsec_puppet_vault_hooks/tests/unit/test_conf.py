"""Tests of the configuration options and :meth:`Consumer.from_conf`."""

from __future__ import annotations

import os

import fixtures
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from oslo_config import cfg
from oslotest import base

from ipsec_puppet_vault_hooks import Consumer, HooksError
from ipsec_puppet_vault_hooks import conf as hooks_conf
from ipsec_puppet_vault_hooks.conf import opts
from trusted_testing import hooks_events as utils


class OptsTestCase(base.BaseTestCase):
    def test_list_opts(self) -> None:
        groups = {
            group.name: {o.name for o in group_opts}
            for group, group_opts in opts.list_opts()
        }
        self.assertEqual(
            {
                "revocation_hooks": {
                    "actions",
                    "failed_actions",
                    "unreachable_actions",
                    "host_untrusted_actions",
                    "recovered_actions",
                    "verifier_public_key",
                    "max_attempts",
                    "retry_delay",
                    "state_dir",
                },
                "action_log": {"record_file"},
                "action_ipsec": {
                    "vici_socket",
                    "vici_timeout",
                    "terminate_timeout",
                    "peers_dir",
                    "ca_cert",
                    "ca_key",
                    "crl_file",
                    "crl_lifetime",
                    "swanctl_conf",
                },
                "revocation_listener": {
                    "transports",
                    "webhook_host",
                    "webhook_port",
                    "cert_file",
                    "key_file",
                    "ca_file",
                    "webhook_clients",
                    "transport_url",
                    "redrive_interval",
                    "metrics_port",
                    "metrics_host",
                    "topic",
                },
                "action_vault": {
                    "url",
                    "token_file",
                    "namespace",
                    "ca_file",
                    "cert_file",
                    "key_file",
                    "timeout",
                    "node_metadata_key",
                    "pki_mount",
                    "cert_common_name",
                    "transit_mount",
                    "keep_versions",
                    "lease_prefixes",
                    "state_file",
                },
                "action_puppet": {
                    "server_url",
                    "cert_file",
                    "key_file",
                    "ca_file",
                    "certname_template",
                    "timeout",
                    "puppetdb_url",
                },
                "puppet_autosign": {
                    "verifier_url",
                    "cert_file",
                    "key_file",
                    "ca_file",
                    "certname_template",
                    "accepted_states",
                    "require_pp_uuid",
                    "challenge_password",
                    "timeout",
                },
            },
            groups,
        )

    def test_defaults(self) -> None:
        conf = cfg.ConfigOpts()
        hooks_conf.register_opts(conf)
        hooks_conf.register_opts(conf)  # idempotent
        conf([])
        self.assertEqual(["log"], conf.revocation_hooks.actions)
        self.assertEqual(3, conf.revocation_hooks.max_attempts)
        self.assertEqual(0.5, conf.revocation_hooks.retry_delay)
        self.assertIsNone(conf.revocation_hooks.verifier_public_key)
        self.assertIsNone(conf.revocation_hooks.state_dir)
        self.assertIsNone(conf.action_log.record_file)

    def test_max_attempts_minimum(self) -> None:
        conf = cfg.ConfigOpts()
        hooks_conf.register_opts(conf)
        self.assertRaises(
            ValueError,
            conf.set_override,
            "max_attempts",
            0,
            group="revocation_hooks",
        )


class FromConfTestCase(base.BaseTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.tmp = self.useFixture(fixtures.TempDir()).path
        self.key = ed25519.Ed25519PrivateKey.generate()
        self.key_path = os.path.join(self.tmp, "verifier.pem")
        with open(self.key_path, "wb") as f:
            f.write(
                self.key.public_key().public_bytes(
                    serialization.Encoding.PEM,
                    serialization.PublicFormat.SubjectPublicKeyInfo,
                )
            )
        self.conf = cfg.ConfigOpts()
        hooks_conf.register_opts(self.conf)
        self.conf([])

    def test_missing_public_key_option(self) -> None:
        exc = self.assertRaises(HooksError, Consumer.from_conf, self.conf)
        self.assertIn("verifier_public_key", str(exc))

    def test_unknown_action_name(self) -> None:
        self.conf.set_override("verifier_public_key", self.key_path, "revocation_hooks")
        self.conf.set_override("actions", ["nope"], "revocation_hooks")
        exc = self.assertRaises(HooksError, Consumer.from_conf, self.conf)
        self.assertIn("nope", str(exc))

    def test_state_dir_persists_dedup(self) -> None:
        state_dir = os.path.join(self.tmp, "state")
        self.conf.set_override("verifier_public_key", self.key_path, "revocation_hooks")
        self.conf.set_override("actions", [], "revocation_hooks")
        self.conf.set_override("state_dir", state_dir, "revocation_hooks")
        self.conf.set_override("retry_delay", 0.0, "revocation_hooks")
        data = utils.make_event(self.key).to_dict()

        consumer = Consumer.from_conf(self.conf)
        self.assertEqual(3, consumer.max_attempts)
        self.assertFalse(consumer.consume(data).duplicate)
        self.assertTrue(Consumer.from_conf(self.conf).consume(data).duplicate)
        self.assertTrue(
            os.path.exists(os.path.join(state_dir, "processed_events.jsonl"))
        )
