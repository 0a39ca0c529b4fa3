"""What each service and the agent say at start about their configuration
file, run as the real console scripts (``.venv/bin/trusted-*``).

Each command gets a file with a misspelt option in its own section and a
misspelt section: it names both on stderr (file, line, section, option)
before it goes on, and here stops at the configuration error it meets next
(exit status 2). That error is on stderr whatever the log's destination:
with ``log_file`` set it is in the log too, and a log file that cannot be
opened is itself a configuration error, not a traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import NamedTuple

import fixtures
import testtools

UUID = "1c6e1a1c-3d1e-4f0e-9d2a-6f3f2b0a9c11"
BIN = os.path.dirname(sys.executable)


class Command(NamedTuple):
    script: str
    section: str
    #: settings that take the command past the checks it does first
    settings: str
    args: tuple[str, ...]
    #: what its configuration error says (on stderr)
    error: str
    #: whether it logs with oslo.log ([DEFAULT] log_file)
    logs: bool = True


COMMANDS = (
    Command("trusted-registrar", "registrar", "", (),
            "configuration error: missing options in [registrar]"),
    Command("trusted-verifier", "verifier", "", (),
            "configuration error: missing options in [verifier]"),
    Command("trusted-keyservice", "keyservice", "", (),
            "configuration error: missing options in [keyservice]"),
    Command("trusted-agent", "agent",
            f"uuid = {UUID}\nbootstrap_file = {{tmp}}/none.json\n"
            "work_dir = {tmp}/agent\n", (),
            "configuration error: no registrar: [agent] registrar_url is unset"),
    Command("trusted-revocation-listener", "revocation_listener", "", (),
            "configuration error: [revocation_hooks] verifier_public_key is not set"),
    Command("trusted-nova-listener", "nova_listener", "", (),
            "configuration error: missing options in [nova_listener]"),
    Command("trusted-vtpm-manager", "vtpm_manager", "", ("enrol-host",),
            "error: [vtpm_manager] cert_file, key_file and ca_file are needed",
            logs=False),
)  # fmt: skip


class ConfigAtStartTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.tmp = self.useFixture(fixtures.TempDir()).path

    def start(
        self, command: Command, default: str = ""
    ) -> tuple[str, subprocess.CompletedProcess[str]]:
        """Run ``command`` with a file whose ``[DEFAULT]`` is ``default``."""
        path = os.path.join(self.tmp, f"{command.script}.conf")
        settings = command.settings.format(tmp=self.tmp)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(
                f"[DEFAULT]\n{default}\n"
                f"[{command.section}]\n{settings}qoute_interval = 5\n\n"
                f"[{command.section}s]\nport = 1\n"
            )
        proc = subprocess.run(
            [os.path.join(BIN, command.script), "--config-file", path, *command.args],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=self.tmp,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
        return path, proc

    def test_each_command_names_unknown_options_and_sections(self) -> None:
        for command in COMMANDS:
            path, proc = self.start(command)
            name, section = command.script, command.section
            where = f"{name}: warning: {path}"
            line = 4 + command.settings.count("\n")
            self.assertIn(
                f"{where}:{line}: [{section}] qoute_interval: unknown option, ignored",
                proc.stderr,
                name,
            )
            self.assertIn(
                f"{where}:{line + 2}: [{section}s]: unknown section, ignored "
                f"(did you mean {section}?)",
                proc.stderr,
                name,
            )
            self.assertIn(command.error, proc.stderr + proc.stdout, name)
            self.assertEqual(2, proc.returncode, f"{name}: {proc.stderr}")

    def test_each_command_says_its_configuration_error_on_stderr_with_a_log_file(
        self,
    ) -> None:
        for command in COMMANDS:
            name = command.script
            log = os.path.join(self.tmp, f"{name}.log")
            _, proc = self.start(command, f"log_file = {log}")
            self.assertEqual(2, proc.returncode, f"{name}: {proc.stderr}")
            self.assertIn(command.error, proc.stderr, name)
            self.assertNotIn("Traceback", proc.stderr, name)
            if command.logs:
                with open(log, encoding="utf-8") as handle:
                    logged = handle.read()
                self.assertIn(command.error.removeprefix("configuration error: "),
                              logged, name)  # fmt: skip
                self.assertIn(" ERROR ", logged, name)
                self.assertIn(
                    f" WARNING verifier.common.config [-] {self.tmp}/{name}.conf:",
                    logged,
                    name,
                )
                self.assertIn(f"[{command.section}] qoute_interval: unknown option",
                              logged, name)  # fmt: skip
                self.assertEqual(1, proc.stderr.count(command.error), name)

    def test_a_log_file_that_cannot_be_opened_is_a_configuration_error(self) -> None:
        for command in COMMANDS:
            if not command.logs:
                continue
            name = command.script
            log = os.path.join(self.tmp, "missing", f"{name}.log")
            _, proc = self.start(command, f"log_file = {log}")
            self.assertEqual(2, proc.returncode, f"{name}: {proc.stderr}")
            self.assertIn(
                f"{name}: configuration error: [DEFAULT] log_file {log}: "
                "No such file or directory",
                proc.stderr,
                name,
            )
            self.assertNotIn("Traceback", proc.stderr, name)
