"""``trusted-tenant`` in this process: bad input is one line and exit
status 2 before anything is sent."""

from __future__ import annotations

import argparse
import base64
import contextlib
import io
import os
from typing import Any

import fixtures
import testtools

from nova_plugin import cmd
from nova_plugin.commands.policies import PolicyCheck
from nova_plugin.tests.unit.test_tenant import write_certificate
from trusted_testing.softtpm import SoftTpm
from verifier.protocol.ima import Failure
from verifier.protocol.messages.policy_check import (
    NodeCheck,
    PolicyCheckReport,
    PolicyRef,
)


def run_tenant(argv: list[str]) -> tuple[int, str]:
    """``trusted-tenant argv``: (exit status, what it wrote to stderr)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cmd.main(argv)
    return code, err.getvalue()


class TenantCliCase(testtools.TestCase):
    """``self.settings``: a verifier that answers nothing and a tenant
    certificate (in ``self.directory``), for tests of bad input refused
    before anything is sent."""

    NODE = "0f1e2d3c-4b5a-4968-8776-655443322110"

    def setUp(self) -> None:
        super().setUp()
        self.directory = self.useFixture(fixtures.TempDir()).path
        cert, key = write_certificate(self.directory)
        self.settings = [
            "--verifier=https://127.0.0.1:1",
            f"--cert={cert}",
            f"--key={key}",
            f"--ca={cert}",
        ]


class MonitorAttestInputTest(TenantCliCase):
    def setUp(self) -> None:
        super().setUp()
        self.ak = os.path.join(self.directory, "ak")
        with open(self.ak, "w") as f:
            f.write(base64.b64encode(SoftTpm().ak.to_bytes()).decode())

    def test_no_pcr_policy_is_one_line_and_exit_2(self) -> None:
        code, err = run_tenant([*self.settings, "monitor-attest", "--ak", self.ak])
        self.assertEqual(2, code)
        self.assertEqual(
            "trusted-tenant: error: give --pcr N=HEX or --policy FILE\n", err
        )

    def test_a_pcr_value_that_is_not_n_equals_hex_is_one_line_and_exit_2(
        self,
    ) -> None:
        argv = [*self.settings, "monitor-attest", "--ak", self.ak, "--pcr", "0"]
        code, err = run_tenant(argv)
        self.assertEqual(2, code)
        self.assertEqual("trusted-tenant: error: --pcr '0': expected N=HEX\n", err)


class ModeOptionTest(testtools.TestCase):
    def test_an_unknown_mode_names_the_choices_and_exits_2(self) -> None:
        node = "0f1e2d3c-4b5a-4968-8776-655443322110"
        err = io.StringIO()
        with contextlib.redirect_stderr(err):  # argparse's own usage error
            exc = self.assertRaises(
                SystemExit, cmd.main, ["enrol", node, "--mode", "sideways"]
            )
        self.assertEqual(2, exc.code)
        self.assertTrue(
            err.getvalue().endswith(
                "argument --mode: invalid choice: 'sideways' "
                "(choose from 'pull', 'push')\n"
            ),
            err.getvalue(),
        )

    def test_the_mode_is_parsed_into_the_enum(self) -> None:
        from nova_plugin.cliargs import attestation_mode
        from verifier.protocol.attestation import AttestationMode

        self.assertIs(AttestationMode.PUSH, attestation_mode("push"))
        self.assertRaises(argparse.ArgumentTypeError, attestation_mode, "sideways")


class PolicyCheckCliTest(TenantCliCase):
    """``trusted-tenant policy check``: bad input exits 2 before anything is
    sent; the report's lines and exit status (0 only if every node passes;
    the end to end run is verifier/tests/functional/test_policy_check)."""

    def test_a_node_that_is_not_a_uuid_is_one_line_and_exit_2(self) -> None:
        code, err = run_tenant(
            [*self.settings, "policy", "check", "web", "--node", "x"]
        )
        self.assertEqual(2, code)
        self.assertEqual("trusted-tenant: error: --node: 'x' is not a UUID\n", err)

    def test_a_measured_boot_policy_is_one_line_and_exit_2(self) -> None:
        argv = [*self.settings, "policy", "check", "fw", "--all", "--kind",
                "measured-boot"]  # fmt: skip
        code, err = run_tenant(argv)
        self.assertEqual(2, code)
        self.assertIn("only runtime policies", err)
        self.assertEqual(1, err.count("\n"))

    def test_too_many_nodes_is_exit_2(self) -> None:
        nodes = []
        for i in range(1001):
            nodes += ["--node", f"00000000-0000-4000-8000-{i:012d}"]
        code, err = run_tenant([*self.settings, "policy", "check", "web", *nodes])
        self.assertEqual(2, code)
        self.assertIn("at most 1000", err)

    def test_both_or_neither_of_node_and_all_is_exit_2(self) -> None:
        for extra in ([], ["--all", "--node", self.NODE]):
            with contextlib.redirect_stderr(io.StringIO()):
                exc = self.assertRaises(
                    SystemExit, cmd.main, ["policy", "check", "web", *extra]
                )
            self.assertEqual(2, exc.code)

    def test_exactly_one_of_ref_and_file_is_one_line_and_exit_2(self) -> None:
        path = os.path.join(self.directory, "web-2.json")
        with open(path, "w") as f:
            f.write('{"name": "web", "version": 2, "digests": {}}')
        for what in (["web", "--file", path], []):
            with self.subTest(what):
                argv = [*self.settings, "policy", "check", *what, "--all"]
                code, err = run_tenant(argv)
                self.assertEqual(2, code)
                self.assertEqual(
                    "trusted-tenant: error: policy check: give exactly one of "
                    "REF (a stored policy) or --file\n",
                    err,
                )

    def test_base_without_file_is_one_line_and_exit_2(self) -> None:
        argv = [*self.settings, "policy", "check", "web", "--base", "web@1", "--all"]
        code, err = run_tenant(argv)
        self.assertEqual(2, code)
        self.assertEqual("trusted-tenant: error: --base: only with --file (a "
                         "document to check)\n", err)  # fmt: skip

    def test_unreadable_or_bad_file_is_one_line_and_exit_2(self) -> None:
        missing = os.path.join(self.directory, "missing.json")
        bad = os.path.join(self.directory, "bad.json")
        with open(bad, "w") as f:
            f.write("[1, 2")
        for path in (missing, bad, self.directory):
            with self.subTest(path):
                argv = [*self.settings, "policy", "check", "--file", path,
                        "--node", self.NODE]  # fmt: skip
                code, err = run_tenant(argv)
                self.assertEqual(2, code, err)
                self.assertTrue(err.startswith(f"trusted-tenant: error: {path}: "))
                self.assertEqual(1, err.count("\n"), err)

    def test_unreachable_verifier_is_exit_1(self) -> None:
        argv = [*self.settings, "policy", "check", "web", "--node", self.NODE]
        code, err = run_tenant(argv)
        self.assertEqual(1, code)
        self.assertEqual(1, err.count("\n"), err)

    def report(self, *results: NodeCheck) -> dict[str, Any]:
        ref = PolicyRef("web", 5, "ab" * 32)
        return PolicyCheckReport(ref, results).to_dict()

    def test_lines_name_each_failing_entry_and_the_exit_status_follows(self) -> None:
        command = PolicyCheck()
        passed = NodeCheck.judged(self.NODE, 1200, [])
        failed = NodeCheck.judged(
            "1f1e2d3c-4b5a-4968-8776-655443322110",
            1210,
            [
                Failure(
                    1201, "/usr/bin/curl", "digest_mismatch", "sha256:ab not allowed"
                ),
                Failure(
                    1205, "/usr/lib/libx.so.2", "unknown_file", "sha256:cd unknown"
                ),
            ],
        )
        broken = NodeCheck.error_of(
            "2f1e2d3c-4b5a-4968-8776-655443322110", "agent_unreachable", "refused"
        )
        self.assertEqual(0, command.exit_status(self.report(passed)))
        for results in ((passed, failed), (passed, broken), (failed,)):
            self.assertEqual(1, command.exit_status(self.report(*results)))
        lines = command.lines(self.report(passed, failed, broken))
        self.assertIn("3 node(s) checked, 1 pass, 1 would fail, 1 could not", lines[0])
        self.assertIn("web@5", lines[0])
        self.assertEqual(f"{self.NODE}: PASS (1200 entries)", lines[1])
        self.assertIn("FAIL (2 of 1210 entries would fail)", lines[2])
        self.assertEqual(
            "    entry 1201 '/usr/bin/curl': digest_mismatch: sha256:ab not allowed",
            lines[3],
        )
        self.assertIn("entry 1205 '/usr/lib/libx.so.2': unknown_file", lines[4])
        self.assertTrue(lines[5].endswith("ERROR agent_unreachable: refused"))


class SetPolicyInputTest(TenantCliCase):
    """``trusted-tenant node set-policy``: bad input is one line, exit 2,
    before anything is sent (the verifier's URL here answers nothing)."""

    def test_no_change_is_one_line_and_exit_2(self) -> None:
        code, err = run_tenant([*self.settings, "node", "set-policy", self.NODE])
        self.assertEqual(2, code)
        self.assertEqual(
            "trusted-tenant: error: give --runtime-policy, --mb-policy, "
            "--no-runtime-policy or --no-mb-policy\n",
            err,
        )

    def test_a_bad_uuid_is_one_line_and_exit_2(self) -> None:
        argv = [*self.settings, "node", "set-policy", "web-1", "--runtime-policy", "w"]
        code, err = run_tenant(argv)
        self.assertEqual(2, code)
        self.assertEqual(1, err.count("\n"), err)
        self.assertIn("web-1", err)

    def test_a_too_long_reference_is_one_line_and_exit_2(self) -> None:
        argv = [*self.settings, "node", "set-policy", self.NODE, "--mb-policy",
                "x" * 400]  # fmt: skip
        code, err = run_tenant(argv)
        self.assertEqual(2, code)
        self.assertEqual(1, err.count("\n"), err)
        self.assertIn("mb_policy", err)

    def test_a_policy_and_no_policy_of_one_kind_exit_2(self) -> None:
        err = io.StringIO()
        with contextlib.redirect_stderr(err):  # argparse's own usage error
            exc = self.assertRaises(
                SystemExit,
                cmd.main,
                [
                    "node",
                    "set-policy",
                    self.NODE,
                    "--runtime-policy",
                    "w",
                    "--no-runtime-policy",
                ],  # fmt: skip
            )
        self.assertEqual(2, exc.code)
        self.assertIn("not allowed with argument", err.getvalue())

    def test_the_changes_sent(self) -> None:
        from nova_plugin.commands.nodes import SetPolicy

        parser = argparse.ArgumentParser()
        SetPolicy().add_arguments(parser)
        args = parser.parse_args(
            [self.NODE, "--runtime-policy", "web", "--no-mb-policy"]
        )
        self.assertEqual(
            {"runtime_policy": "web", "mb_policy": None}, SetPolicy().changes(args)
        )


class InForceTest(testtools.TestCase):
    def test_status_shows_the_version_in_force_and_whether_it_follows(self) -> None:
        from nova_plugin.commands.nodes import describe

        node = {
            "uuid": "n",
            "state": "attested",
            "quotes_verified": 3,
            "policies": {
                "runtime": {"name": "web", "version": 5, "digest": "ab" * 32,
                            "follows": True},
                "measured-boot": {"name": "fw", "version": 1, "digest": "cd" * 32,
                                  "follows": False},
            },
        }  # fmt: skip
        text = describe(node)
        self.assertIn("runtime policy: web@5 (follows web)", text)
        self.assertIn("measured-boot policy: fw@1 (pinned)", text)

    def test_events_name_the_policy_change(self) -> None:
        from nova_plugin.commands.events import Events
        from verifier.protocol.events import PolicyChange

        detail = PolicyChange(
            "runtime",
            {"name": "web", "version": 4, "digest": "ab" * 32},
            {"name": "web", "version": 5, "digest": "cd" * 32},
        ).to_detail()
        event = {"created_at": "T", "node_uuid": "n", "type": "node.policy_changed",
                 "reason": "follow", "detail": detail}  # fmt: skip
        lines = Events().lines(
            {"events": [{"signed_event": {"event": event}, "delivered": True}]}
        )
        self.assertEqual(
            ["T  n  policy_changed  follow: runtime web@4 -> web@5 "
             "(delivered: True)"],
            lines,
        )  # fmt: skip


class HostVerdictWordsTest(testtools.TestCase):
    def test_status_names_host_untrusted_and_its_host(self) -> None:
        from nova_plugin.commands.nodes import describe

        node = {
            "uuid": "n",
            "state": "host_untrusted",
            "quotes_verified": 3,
            "failure_reason": "host_untrusted: its compute host c1 is untrusted",
            "host": {"name": "c1", "trusted": False, "as_of": "2026-11-28T20:00:00Z"},
        }
        text = describe(node)
        self.assertIn("n: HOST UNTRUSTED", text)
        self.assertIn("compute host: c1, UNTRUSTED as of 2026-11-28T20:00:00Z", text)

    def test_status_of_a_node_on_an_unreachable_host(self) -> None:
        from nova_plugin.commands.nodes import describe

        node = {"uuid": "n", "state": "attested", "quotes_verified": 1,
                "host": {"name": "c1", "trusted": None, "as_of": None}}  # fmt: skip
        self.assertIn("compute host: c1, not known now", describe(node))

    def test_events_print_host_untrusted(self) -> None:
        from nova_plugin.commands.events import Events

        event = {"created_at": "T", "node_uuid": "n", "type": "node.host_untrusted",
                 "reason": "host_untrusted",
                 "detail": "its compute host c1 is untrusted"}  # fmt: skip
        lines = Events().lines(
            {"events": [{"signed_event": {"event": event}, "delivered": True}]}
        )
        self.assertEqual(
            ["T  n  host_untrusted  host_untrusted: its compute host c1 is "
             "untrusted (delivered: True)"],
            lines,
        )  # fmt: skip
