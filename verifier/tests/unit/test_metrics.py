"""Prometheus metrics (:mod:`verifier.common.metrics`): counted where
things happen, gauges set at scrape, ``GET /metrics`` behind its rule, and
no label ever names a node or a project (doc/source/admin/monitoring.rst).

Counters are process-wide: every test compares the value before and after.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import pathlib
import re
import uuid as uuid_mod
from typing import Any

import fixtures
import testtools
from aiohttp.test_utils import TestClient, TestServer
from oslo_config import cfg
from oslo_context import context

from trusted_testing.auth import open_auth
from trusted_testing.softtpm import SoftTpm
from verifier.api.verifier_app import make_app as verifier_app
from verifier.common import metrics
from verifier.common.tls import self_signed_certificate
from verifier.db import make_engine, upgrade
from verifier.policies import make_enforcer
from verifier.protocol.messages.registration import RegistrationRequest
from verifier.registrar import Registrar
from verifier.registrar import make_app as registrar_app
from verifier.tests.unit.test_attest_service import VerifierServiceBase

ROOT = pathlib.Path(__file__).resolve().parents[3]


def _value(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


class ReasonLabelTest(testtools.TestCase):
    def test_known_reason_is_its_own_label(self) -> None:
        self.assertEqual("pcr_policy", metrics.reason_label("pcr_policy"))
        self.assertEqual("none", metrics.reason_label(None))

    def test_free_text_reason_is_other(self) -> None:
        label = metrics.reason_label("tenant says: node 1234 of project acme")
        self.assertEqual("other", label)

    def test_every_failure_code_of_the_verifier_is_known(self) -> None:
        # a new EvidenceError code must be listed, or it is counted as other
        pattern = re.compile(
            r'(?:EvidenceError|_revoked|round_failed|\brevoke)\(\s*"([a-z_0-9]+)"'
        )
        found = set()
        for path in (ROOT / "verifier").rglob("*.py"):
            if "tests" not in path.parts:
                found.update(pattern.findall(path.read_text(encoding="utf-8")))
        self.assertGreater(len(found), 30)
        self.assertEqual(set(), found - metrics.REASONS)

    def test_metric_names_follow_the_conventions(self) -> None:
        for family in metrics.REGISTRY.collect():
            if family.name.startswith(("process_", "python_")):
                continue
            self.assertTrue(family.name.startswith("trusted_cloud_"), family.name)
            labels = {k for s in family.samples for k in s.labels}
            for banned in ("node", "uuid", "node_uuid", "project", "project_id"):
                self.assertNotIn(banned, labels, family.name)

    def test_policy_rule_defaults_like_stats(self) -> None:
        conf = cfg.ConfigOpts()
        conf([], project="trusted-cloud")
        enforcer = make_enforcer(conf)

        def allowed(*roles: str) -> bool:
            ctx = context.RequestContext(project_id="p1", roles=list(roles))
            target = {"project_id": "p1"}
            rule = "attestation:metrics:get"
            return bool(enforcer.authorize(rule, target, ctx, do_raise=False))

        self.assertTrue(allowed("admin"))
        self.assertTrue(allowed("service"))
        self.assertFalse(allowed("member", "reader"))


class VerifierMetricsTest(VerifierServiceBase):
    async def test_good_quote_counts_a_pull_pass_and_its_round(self) -> None:
        verifier = self.new_verifier()
        agent = self.new_agent()
        await self.enrol(verifier, agent)
        passed = _value(
            "trusted_cloud_attestations_total",
            mode="pull",
            result="pass",
            reason="none",
        )
        rounds = _value("trusted_cloud_quote_round_seconds_count", mode="pull")
        await verifier.rounds.attest_once(agent.uuid)
        after = _value(
            "trusted_cloud_attestations_total",
            mode="pull",
            result="pass",
            reason="none",
        )
        self.assertEqual(passed + 1, after)
        rounds_after = _value("trusted_cloud_quote_round_seconds_count", mode="pull")
        self.assertEqual(rounds + 1, rounds_after)

    async def test_tampered_node_counts_a_failure_and_a_revocation(self) -> None:
        verifier = self.new_verifier()
        agent = self.new_agent()
        await self.enrol(verifier, agent)
        await verifier.rounds.attest_once(agent.uuid)
        labels = {"mode": "pull", "result": "fail", "reason": "pcr_policy"}
        failed = _value("trusted_cloud_attestations_total", **labels)
        revoked = _value(
            "trusted_cloud_node_transitions_total", kind="revoked", reason="pcr_policy"
        )
        agent.tpm.extend(16, hashlib.sha256(b"rootkit").digest())
        await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual(
            failed + 1, _value("trusted_cloud_attestations_total", **labels)
        )
        self.assertEqual(
            revoked + 1,
            _value(
                "trusted_cloud_node_transitions_total",
                kind="revoked",
                reason="pcr_policy",
            ),
        )

    async def test_revoke_on_request_with_free_text_is_counted_as_other(self) -> None:
        verifier = self.new_verifier()
        agent = self.new_agent()
        await self.enrol(verifier, agent)
        before = _value(
            "trusted_cloud_node_transitions_total", kind="revoked", reason="other"
        )
        await verifier.commands.revoke(agent.uuid, f"lost {agent.uuid}", "by hand")
        after = _value(
            "trusted_cloud_node_transitions_total", kind="revoked", reason="other"
        )
        self.assertEqual(before + 1, after)
        text = metrics.REGISTRY.collect()
        for family in text:
            for sample in family.samples:
                self.assertNotIn(agent.uuid, str(sample.labels))

    async def test_unreachable_node_is_counted_once(self) -> None:
        verifier = self.new_verifier()
        agent = self.new_agent()
        await self.enrol(verifier, agent)
        await verifier.rounds.attest_once(agent.uuid)
        before = _value(
            "trusted_cloud_node_transitions_total",
            kind="unreachable",
            reason="unreachable",
        )
        agent.unreachable = True
        for _ in range(5):
            await verifier.rounds.attest_once(agent.uuid)
        after = _value(
            "trusted_cloud_node_transitions_total",
            kind="unreachable",
            reason="unreachable",
        )
        self.assertEqual(before + 1, after)

    async def _one_attested_one_revoked(self) -> Any:
        """A verifier with a node attested and a node revoked (its PCR 16
        tampered), its gauges refreshed."""
        verifier = self.new_verifier(notifiers=[])
        good, bad = self.new_agent(), self.new_agent()
        await self.enrol(verifier, good)
        await self.enrol(verifier, bad)
        await verifier.rounds.attest_once(good.uuid)
        await verifier.rounds.attest_once(bad.uuid)
        bad.tpm.extend(16, hashlib.sha256(b"rootkit").digest())
        await verifier.rounds.attest_once(bad.uuid)
        await verifier.gauges.refresh()
        return verifier

    async def test_gauges_count_nodes_by_state_and_the_outbox(self) -> None:
        await self._one_attested_one_revoked()
        self.assertEqual(
            1, _value("trusted_cloud_nodes", state="attested", mode="pull")
        )
        self.assertEqual(1, _value("trusted_cloud_nodes", state="revoked", mode="pull"))
        self.assertEqual(0, _value("trusted_cloud_nodes", state="failed", mode="push"))
        self.assertEqual(1, _value("trusted_cloud_outbox_depth"))
        self.assertGreaterEqual(_value("trusted_cloud_outbox_oldest_age_seconds"), 0)
        self.assertEqual(0, _value("trusted_cloud_quote_lag_seconds"))  # paused

    async def test_gauges_show_the_log_waiting_then_sequenced(self) -> None:
        verifier = await self._one_attested_one_revoked()
        # two attested, one revoked: staged, none in the signed tree yet
        self.assertEqual(
            (0, 3),
            (
                _value("trusted_cloud_log_entries"),
                _value("trusted_cloud_log_unsequenced"),
            ),
        )
        self.assertGreaterEqual(
            _value("trusted_cloud_log_oldest_unsequenced_age_seconds"), 0
        )
        self.assertEqual(3, verifier.log_pump.pass_once())
        await verifier.gauges.refresh()
        self.assertEqual(
            (3, 0, 0),
            (
                _value("trusted_cloud_log_entries"),
                _value("trusted_cloud_log_unsequenced"),
                _value("trusted_cloud_log_oldest_unsequenced_age_seconds"),
            ),
        )

    async def test_metrics_endpoint_serves_the_text_format(self) -> None:
        verifier = self.new_verifier()
        app = verifier_app(verifier, "PEM", open_auth())
        async with TestClient(TestServer(app)) as client:
            resp = await client.get("/metrics")
            self.assertEqual(200, resp.status)
            self.assertTrue(resp.headers["Content-Type"].startswith("text/plain"))
            text = await resp.text()
            self.assertIn("# TYPE trusted_cloud_attestations_total counter", text)
            self.assertIn('trusted_cloud_nodes{mode="pull",state="attested"}', text)
            resp = await client.get(
                "/metrics", headers={"Accept": "application/openmetrics-text"}
            )
            self.assertIn("openmetrics", resp.headers["Content-Type"])
            self.assertTrue((await resp.text()).endswith("# EOF\n"))

    async def test_metrics_endpoint_refuses_a_caller_without_the_rule(self) -> None:
        verifier = self.new_verifier()
        auth = open_auth()
        app = verifier_app(verifier, "PEM", auth.__class__(auth.enforcer))
        async with TestClient(TestServer(app)) as client:
            resp = await client.get("/metrics")
            self.assertEqual(401, resp.status)


class RegistrarMetricsTest(testtools.TestCase):
    def test_registrations_and_activations_are_counted_by_result(self) -> None:
        tmp = self.useFixture(fixtures.TempDir()).path
        engine = make_engine("sqlite:///" + os.path.join(tmp, "r.db"))
        self.addCleanup(engine.dispose)
        upgrade(engine)
        tpm = SoftTpm(ak_alg="ecc", ek_alg="ecc")
        cert = self_signed_certificate("agent", ["192.0.2.7"])[1].decode()
        body = RegistrationRequest(tpm.ek, None, tpm.ak, cert, "192.0.2.7", 8892)
        path = f"/v1/agents/{uuid_mod.uuid4()}"
        accepted = _value("trusted_cloud_registrations_total", result="accepted")
        refused = _value("trusted_cloud_activations_total", result="refused")

        async def go() -> tuple[int, str]:
            app = registrar_app(Registrar(engine))
            async with TestClient(TestServer(app)) as client:
                await client.post(path, json=body.to_dict())
                await client.post(path + "/activate", json={"credential": "AAAA"})
                resp = await client.get("/metrics")
                return resp.status, await resp.text()

        status, text = asyncio.run(go())
        self.assertEqual(200, status)
        self.assertIn("trusted_cloud_registrations_total", text)
        self.assertEqual(
            accepted + 1,
            _value("trusted_cloud_registrations_total", result="accepted"),
        )
        self.assertEqual(
            refused + 1, _value("trusted_cloud_activations_total", result="refused")
        )
