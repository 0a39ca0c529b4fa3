"""The policy in code: its entry points, the generated sample and what the
defaults allow (oslo.policy's own enforcer, no Keystone)."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import entry_points

import testtools
from oslo_config import cfg
from oslo_context import context

from verifier.policies import ALL_PROJECTS, get_enforcer, list_rules, make_enforcer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))


def _ctx(project: str | None, *roles: str) -> context.RequestContext:
    return context.RequestContext(project_id=project, roles=list(roles))


class PolicyDefaultsTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        conf = cfg.ConfigOpts()
        conf([], project="trusted-cloud")
        self.enforcer = make_enforcer(conf)

    def allowed(self, rule: str, ctx: context.RequestContext) -> bool:
        target = {"project_id": ctx.project_id or "-"}
        return bool(self.enforcer.authorize(rule, target, ctx, do_raise=False))

    def test_every_operation_has_a_documented_rule(self) -> None:
        names = {r.name for r in list_rules()}
        for name in ("node:create", "node:list", "node:get", "node:revoke",
                     "node:delete", "node:instance_created", "node:capability",
                     "node:stats", "policy:create", "policy:list", "policy:get",
                     "policy:delete", "event:list"):  # fmt: skip
            self.assertIn(f"attestation:{name}", names)

    def test_reader_reads_but_cannot_write(self) -> None:
        reader = _ctx("p1", "reader")
        self.assertTrue(self.allowed("attestation:node:list", reader))
        self.assertFalse(self.allowed("attestation:node:create", reader))
        self.assertFalse(self.allowed("attestation:node:revoke", reader))
        self.assertFalse(self.allowed("attestation:policy:delete", reader))

    def test_member_is_held_to_its_project(self) -> None:
        member = _ctx("p1", "member", "reader")
        self.assertTrue(self.allowed("attestation:node:create", member))
        self.assertFalse(self.allowed(ALL_PROJECTS, member))
        target = {"project_id": "p2"}
        self.assertFalse(
            self.enforcer.authorize("attestation:node:get", target, member)
        )

    def test_admin_and_service_see_all_projects(self) -> None:
        self.assertTrue(self.allowed(ALL_PROJECTS, _ctx("p1", "admin")))
        self.assertTrue(self.allowed(ALL_PROJECTS, _ctx(None, "service")))
        self.assertFalse(self.allowed("attestation:node:create", _ctx(None, "service")))

    def test_monitoring_reads_stats_and_metrics_only(self) -> None:
        names = ("attestation:node:stats", "attestation:metrics:get")
        for who in (_ctx("ops", "attestation_observer"), _ctx(None, "service"),
                    _ctx("p1", "admin")):  # fmt: skip
            for name in names:
                self.assertTrue(self.allowed(name, who), (name, who.roles))
        observer = _ctx("ops", "attestation_observer")
        self.assertFalse(self.allowed(ALL_PROJECTS, observer))
        for default in list_rules():
            if default.name.startswith("attestation:") and default.name not in names:
                self.assertFalse(self.allowed(default.name, observer), default.name)

    def test_member_and_reader_do_not_read_stats_or_metrics(self) -> None:
        for who in (_ctx("p1", "member", "reader"), _ctx("p1", "reader")):
            for rule in ("attestation:node:stats", "attestation:metrics:get"):
                self.assertFalse(self.allowed(rule, who), (rule, who.roles))

    def test_no_role_no_access(self) -> None:
        nobody = _ctx("p1")
        for rule in list_rules():
            if rule.name.startswith("attestation:"):
                self.assertFalse(self.allowed(rule.name, nobody), rule.name)

    def test_entry_points_load(self) -> None:
        group = entry_points(group="oslo.policy.policies")
        (found,) = [e for e in group if e.name == "trusted-cloud"]
        self.assertEqual(list_rules(), found.load()())
        group = entry_points(group="oslo.policy.enforcer")
        (found,) = [e for e in group if e.name == "trusted-cloud"]
        self.assertIs(found.load(), get_enforcer)

    def test_sample_policy_file_is_current(self) -> None:
        sample = os.path.join(ROOT, "etc", "policy.yaml.sample")
        generator = os.path.join(os.path.dirname(sys.executable),
                                 "oslopolicy-sample-generator")  # fmt: skip
        out = subprocess.run(
            [generator, "--namespace", "trusted-cloud"],
            capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
        with open(sample, encoding="utf-8") as f:
            self.assertEqual(f.read(), out.stdout, "run tox -e genpolicy")
