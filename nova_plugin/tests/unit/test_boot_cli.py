"""The two front ends: every option documented, bad input refused early."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys

import fixtures
import testtools

from nova_plugin import nova_cmd
from nova_plugin.bootcli import add_boot_arguments, load_policy
from nova_plugin.exceptions import UsageError


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]


class HelpTest(testtools.TestCase):
    def test_trusted_nova_boot_help_documents_every_option(self) -> None:
        parser = nova_cmd.parser(["boot"])
        boot = parser._subparsers._group_actions[0].choices["boot"]  # type: ignore[union-attr]
        text = boot.format_help()
        actions = _options(boot)
        self.assertGreater(len(actions), 30)
        for action in actions:
            self.assertTrue(action.help, f"{action.option_strings} has no help")
            name = action.option_strings[0] if action.option_strings else action.metavar
            self.assertIn(str(name), text)

    def test_openstack_help_trusted_server_create_documents_every_option(
        self,
    ) -> None:
        ours = argparse.ArgumentParser(add_help=False)
        add_boot_arguments(ours)
        openstack = os.path.join(os.path.dirname(sys.executable), "openstack")
        out = subprocess.run(
            [openstack, "help", "trusted", "server", "create"],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
        self.assertIn("usage: openstack trusted server create", out)
        for action in _options(ours):
            name = action.option_strings[0] if action.option_strings else action.metavar
            self.assertIn(str(name), out)
            self.assertIn(str(action.help).split()[0], out)


class BadInputTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.dir = self.useFixture(fixtures.TempDir()).path
        for name in ("payload", "cert", "key", "ca"):
            with open(os.path.join(self.dir, name), "w") as f:
                f.write("x")

    def run_boot(self, policy_text: str) -> tuple[int, str]:
        policy = os.path.join(self.dir, "policy.json")
        with open(policy, "w") as f:
            f.write(policy_text)
        d = self.dir
        argv = [
            "boot", "vm", "--flavor", "1", "--image", "img",
            "--payload", f"{d}/payload", "--trust-policy", policy,
            "--registrar", "https://127.0.0.1:9", "--verifier", "https://127.0.0.1:9",
            "--cert", f"{d}/cert", "--key", f"{d}/key", "--ca", f"{d}/ca",
            "--os-auth-type", "none", "--os-endpoint", "http://127.0.0.1:9/v2.1",
        ]  # fmt: skip
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            code = nova_cmd.main(argv)
        return code, err.getvalue()

    def test_policy_file_that_is_not_json_is_refused_before_nova(self) -> None:
        code, err = self.run_boot("{not json")
        self.assertEqual(2, code)
        self.assertIn(f"--trust-policy {self.dir}/policy.json: ", err)
        self.assertIn("line 1 column 2", err)
        self.assertEqual(1, len(err.strip().splitlines()), err)
        self.assertNotIn("Traceback", err)
        self.assertNotIn("Nova", err)

    def test_policy_with_a_bad_pcr_value_is_refused_before_nova(self) -> None:
        code, err = self.run_boot(json.dumps({"pcrs": {"16": ["zz"]}}))
        self.assertEqual(2, code)
        self.assertIn(f"--trust-policy {self.dir}/policy.json: ", err)
        self.assertNotIn("Nova", err)

    def test_deeply_nested_policy_file_exits_2_without_a_traceback(self) -> None:
        code, err = self.run_boot("[" * 100_000 + "]" * 100_000)
        self.assertEqual(2, code)
        self.assertIn("nested more than", err)
        self.assertNotIn("Traceback", err)

    def test_unusable_certificate_files_are_one_line_and_exit_2(self) -> None:
        code, err = self.run_boot(json.dumps({"pcrs": {"16": ["00" * 32]}}))
        self.assertEqual(2, code)
        self.assertIn(f"--cert {self.dir}/cert, --key {self.dir}/key", err)
        self.assertIn("not a usable certificate, key and CA (PEM)", err)
        self.assertEqual(1, len(err.strip().splitlines()), err)
        self.assertNotIn("Traceback", err)

    def test_missing_payload_file_names_the_option_and_path(self) -> None:
        os.remove(os.path.join(self.dir, "payload"))
        code, err = self.run_boot(json.dumps({"pcrs": {"16": ["00" * 32]}}))
        self.assertEqual(2, code)
        self.assertIn(f"--payload {self.dir}/payload: No such file or directory", err)
        self.assertEqual(1, len(err.strip().splitlines()), err)


class StoredPolicyTest(testtools.TestCase):
    """``--runtime-policy``/``--mb-policy`` stand in for a PCR policy."""

    def _args(self, *argv: str) -> argparse.Namespace:
        parser = argparse.ArgumentParser()
        add_boot_arguments(parser)
        base = ["vm", "--flavor", "1", "--image", "img", "--payload", "p"]
        return parser.parse_args([*base, *argv])

    def test_a_stored_runtime_policy_alone_gives_an_empty_pcr_policy(self) -> None:
        args = self._args("--runtime-policy", "image", "--mb-policy", "seabios")
        self.assertEqual((), tuple(load_policy(args).pcrs))
        self.assertEqual(("image", "seabios"), (args.runtime_policy, args.mb_policy))

    def test_no_policy_at_all_is_refused_naming_the_options(self) -> None:
        with self.assertRaises(UsageError) as ctx:
            load_policy(self._args())
        self.assertIn("--runtime-policy", str(ctx.exception))
        self.assertIn("--trust-policy", str(ctx.exception))
