"""``trusted-tenant`` in this process: bad input is one line and exit
status 2 before anything is sent."""

from __future__ import annotations

import argparse
import base64
import contextlib
import io
import os

import fixtures
import testtools

from nova_plugin import cmd
from nova_plugin.tests.unit.test_tenant import write_certificate
from trusted_testing.softtpm import SoftTpm


def run_tenant(argv: list[str]) -> tuple[int, str]:
    """``trusted-tenant argv``: (exit status, what it wrote to stderr)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cmd.main(argv)
    return code, err.getvalue()


class MonitorAttestInputTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        directory = self.useFixture(fixtures.TempDir()).path
        cert, key = write_certificate(directory)
        self.ak = os.path.join(directory, "ak")
        with open(self.ak, "w") as f:
            f.write(base64.b64encode(SoftTpm().ak.to_bytes()).decode())
        self.settings = [
            "--verifier=https://127.0.0.1:1",
            f"--cert={cert}",
            f"--key={key}",
            f"--ca={cert}",
        ]

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
