"""Monitoring with a real Prometheus and Alertmanager (Debian's packages;
doc/source/admin/monitoring.rst): Prometheus scrapes the running verifier
and registrar over mTLS with the operator's client certificate and
evaluates the repository's alerting rules; a tampered node is revoked, the
``TrustedCloudNodeRevoked`` alert fires, and Alertmanager delivers it to a
webhook this test holds. The rules file itself passes ``promtool check
rules`` and its own ``promtool test rules`` cases.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any, ClassVar

import testtools

from trusted_testing.cluster import wait_until
from trusted_testing.cluster_case import ClusterTestCase
from trusted_testing.e2e import Http
from trusted_testing.prometheus import (
    RULES,
    PrivateAlertmanager,
    PrivatePrometheus,
    ScrapeTarget,
    WebhookReceiver,
)
from verifier.protocol import PcrPolicy

PAYLOAD = b"#!/bin/sh\ntrue\n"
REVOKED = 'trusted_cloud_node_transitions_total{kind="revoked",reason="pcr_policy"}'


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        raise AssertionError(
            "promtool is not installed: apt-get install prometheus "
            "(tools/apt-packages.txt)"
        )
    return found


class AlertRulesFileTest(testtools.TestCase):
    def test_rules_file_passes_promtool_check(self) -> None:
        out = subprocess.run(
            [_promtool(), "check", "rules", RULES],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        self.assertEqual(0, out.returncode, out.stdout + out.stderr)

    def test_rules_unit_cases_pass(self) -> None:
        cases = os.path.join(os.path.dirname(RULES), "trusted-cloud.rules.test.yml")
        out = subprocess.run(
            [_promtool(), "test", "rules", cases],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        self.assertEqual(0, out.returncode, out.stdout + out.stderr)


class PrometheusAlertTest(ClusterTestCase):
    """One node on swtpm, the services scraped by a private Prometheus."""

    prefix = "trusted-prometheus-"
    node_count = 1
    interval = 0.5
    registrar_options = {"metrics_clients": ["operator"]}
    wait_timeout = 60.0

    webhook: ClassVar[WebhookReceiver]
    alertmanager: ClassVar[PrivateAlertmanager]
    prometheus: ClassVar[PrivatePrometheus]
    policy: ClassVar[PcrPolicy]

    @classmethod
    def set_up_cluster(cls) -> None:
        cluster = cls.cluster
        cls.policy = PcrPolicy.from_dict({"pcrs": {"16": [cluster.good_pcr_hex()]}})
        tls = (
            cluster.pki_file("ca.pem"),
            cluster.pki_file("operator.pem"),
            cluster.pki_file("operator-key.pem"),
        )
        targets = [
            ScrapeTarget(
                "trusted-cloud-verifier", f"127.0.0.1:{cluster.verifier_port}", *tls
            ),
            ScrapeTarget(
                "trusted-cloud-registrar", f"127.0.0.1:{cluster.registrar_port}", *tls
            ),
        ]
        cls.webhook = WebhookReceiver()
        cls.alertmanager = PrivateAlertmanager(cls.tmp, cls.webhook.url)
        cls.alertmanager.start()
        cls.prometheus = PrivatePrometheus(cls.tmp, targets, cls.alertmanager.port)
        cls.prometheus.start()

    @classmethod
    def _stop(cls) -> None:
        for name in ("prometheus", "alertmanager", "webhook"):
            part = cls.__dict__.get(name)
            if part is not None:
                part.stop()
        super()._stop()

    def targets_up(self) -> dict[str, str]:
        return {t["labels"]["job"]: t["health"] for t in self.prometheus.targets()}

    def value(self, expr: str) -> float | None:
        result = self.prometheus.query(expr)
        return float(result[0]["value"][1]) if result else None

    def test_services_are_scraped_with_the_operator_certificate(self) -> None:
        up = {"trusted-cloud-verifier": "up", "trusted-cloud-registrar": "up"}
        wait_until(lambda: self.targets_up() == up, 60, what="both targets up")
        self.assertEqual(up, self.targets_up())
        accepted = 'trusted_cloud_registrations_total{result="accepted"}'
        got = wait_until(lambda: self.value(accepted), 30, what=accepted)
        self.assertGreaterEqual(got, 1.0)  # the node's agent registered

    def test_metrics_are_refused_to_a_tenant_certificate(self) -> None:
        tenant = Http(self.cluster, "tenant")
        for base in (self.cluster.verifier_url, self.cluster.registrar_url):
            r = tenant.call("GET", f"{base}/metrics")
            self.assertEqual(403, r.status_code, f"{base}: {r.text}")
            self.assertNotIn("trusted_cloud_", r.text)

    def test_tampered_node_fires_the_revoked_alert_at_the_webhook(self) -> None:
        node = self.cluster.nodes[0]
        self.run_async(self.tenant.enrol(node.uuid, PAYLOAD, self.policy))
        self.wait_for(node.uuid, lambda s: s["state"] == "attested")
        # Prometheus holds the revocation counter at 0 before the revocation
        wait_until(lambda: self.value(REVOKED) == 0.0, 60, what=f"{REVOKED} at 0")
        wait_until(
            lambda: (self.value('sum(trusted_cloud_attestations_total{result="pass"})')
                     or 0) > 0,
            60,
            what="good quotes scraped",
        )  # fmt: skip
        self.assertEqual([], self.revoked_alerts())

        self.cluster.tamper(node)
        self.wait_for(node.uuid, lambda s: s["state"] == "revoked")
        alerts = wait_until(self.revoked_alerts, 120, what="alert at the webhook")
        alert = alerts[0]
        self.assertEqual("firing", alert["status"])
        self.assertEqual("TrustedCloudNodeRevoked", alert["labels"]["alertname"])
        self.assertEqual("pcr_policy", alert["labels"]["reason"])
        self.assertEqual("critical", alert["labels"]["severity"])
        self.assertIn("pcr_policy", alert["annotations"]["summary"])
        # no label names the node
        for value in alert["labels"].values():
            self.assertNotIn(node.uuid, value)

    def revoked_alerts(self) -> list[dict[str, Any]]:
        return [
            a
            for a in self.webhook.alerts()
            if a["labels"].get("alertname") == "TrustedCloudNodeRevoked"
        ]
