"""The policy files shipped for Horizon are the API's rules in code."""

from __future__ import annotations

import os

import testtools
import yaml

import attestation_dashboard
from verifier.policies import list_rules


class PolicyFileTest(testtools.TestCase):
    def test_the_policy_file_is_the_in_code_defaults(self) -> None:
        with open(attestation_dashboard.POLICY_FILE) as f:
            shipped = yaml.safe_load(f)
        expected = {r.name: r.check_str for r in list_rules()}
        self.assertEqual(expected, shipped)

    def test_the_default_policy_file_is_the_in_code_defaults(self) -> None:
        with open(attestation_dashboard.DEFAULT_POLICY_FILE) as f:
            shipped = yaml.safe_load(f)
        expected = [(r.name, r.check_str) for r in list_rules()]
        self.assertEqual(expected, [(r["name"], r["check_str"]) for r in shipped])

    def test_enabled_files_are_the_four_panels(self) -> None:
        names = [os.path.basename(p) for p in attestation_dashboard.enabled_files()]
        self.assertEqual(
            [
                "_1920_project_attestation_panel_group.py",
                "_1921_project_attestation_nodes_panel.py",
                "_1922_project_attestation_policies_panel.py",
                "_1930_admin_attestation_panel.py",
            ],
            names,
        )
