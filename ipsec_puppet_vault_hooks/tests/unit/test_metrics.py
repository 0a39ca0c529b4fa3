"""The revocation listener's Prometheus metrics: hook action results and
dead letters counted by the consumer, served on ``[revocation_listener]
metrics_port`` (doc/source/admin/monitoring.rst)."""

from __future__ import annotations

import urllib.request

from cryptography.hazmat.primitives.asymmetric import ed25519
from oslo_config import cfg
from oslotest import base

from ipsec_puppet_vault_hooks import Consumer
from ipsec_puppet_vault_hooks.cmd import listener as listener_cmd
from ipsec_puppet_vault_hooks.conf import listener as listener_conf
from trusted_testing import hooks_events as utils
from trusted_testing.cluster import free_port
from verifier.common import metrics


def _value(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


class HookMetricsTest(base.BaseTestCase):
    def test_action_results_and_dead_letters_are_counted(self) -> None:
        key = ed25519.Ed25519PrivateKey.generate()
        good = utils.RecordingAction("metrics_good")
        broken = utils.BrokenAction("metrics_broken")
        consumer = Consumer(
            [key.public_key()], [good, broken], max_attempts=2, sleep=lambda _: None
        )
        consumer.consume(utils.make_event(key).to_dict())
        ok = "trusted_cloud_hook_actions_total"
        self.assertEqual(1, _value(ok, action="metrics_good", result="succeeded"))
        self.assertEqual(1, _value(ok, action="metrics_broken", result="failed"))
        dead = "trusted_cloud_hook_dead_letters_total"
        self.assertEqual(1, _value(dead, action="metrics_broken"))
        self.assertEqual(0, _value(dead, action="metrics_good"))

    def test_metrics_port_serves_the_registry_on_loopback(self) -> None:
        conf = cfg.ConfigOpts()
        listener_conf.register_opts(conf)
        conf([], project="trusted-cloud-test")
        self.assertIsNone(listener_cmd.serve_metrics(conf.revocation_listener))
        port = free_port()
        conf.set_override("metrics_port", port, "revocation_listener")
        server = listener_cmd.serve_metrics(conf.revocation_listener)
        self.addCleanup(server.server_close)
        self.addCleanup(server.shutdown)
        url = f"http://127.0.0.1:{port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310
            text = resp.read().decode()
        self.assertIn("# TYPE trusted_cloud_hook_dead_letters_total counter", text)
