"""A console script of another role names the extra it needs in one line
(:mod:`verifier.common.launch`).

Each script runs here through the entry point setup.cfg declares for it,
in a fresh interpreter where the modules of its role's extra are hidden (as
in a venv of another role): it must print the one line on stderr and exit
2, before importing its command. The functional twin
(``verifier/tests/functional/test_install_roles.py``) runs the installed
scripts in the venvs of the other roles.
"""

from __future__ import annotations

import configparser
import os
import subprocess
import sys

import fixtures
import testtools

from verifier.common import extras, launch
from verifier.tests.unit.test_install_roles import ROLES, ROOT

#: Hides ``sys.argv[2:]`` (as in a venv without them), then runs the entry
#: point ``sys.argv[1]`` (``module:function``) as its console script would.
_RUN_HIDDEN = (
    "import importlib, sys\n"
    "target, hidden = sys.argv[1], sys.argv[2:]\n"
    "for name in hidden:\n"
    "    sys.modules[name] = None\n"
    "module, _, function = target.partition(':')\n"
    "sys.argv = [sys.argv[0], '--version']\n"
    "sys.exit(getattr(importlib.import_module(module), function)())\n"
)


def console_scripts() -> dict[str, str]:
    """setup.cfg's console scripts: name -> ``module:function``."""
    parser = configparser.ConfigParser()
    parser.read(os.path.join(ROOT, "setup.cfg"))
    return {
        name.strip(): target.strip()
        for name, _, target in (
            line.partition("=")
            for line in parser["entry_points"]["console_scripts"].splitlines()
            if line.strip()
        )
    }


def run_hidden(
    target: str, hidden: tuple[str, ...]
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _RUN_HIDDEN, target, *hidden],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )


class ScriptTableTest(testtools.TestCase):
    def test_every_console_script_enters_through_the_launcher(self) -> None:
        scripts = console_scripts()
        self.assertEqual(set(launch.SCRIPTS), set(scripts))
        for name, target in scripts.items():
            self.assertEqual(
                f"verifier.common.launch:{name.replace('-', '_')}", target, name
            )

    def test_each_script_runs_a_module_of_its_role(self) -> None:
        for name, (module, role) in launch.SCRIPTS.items():
            self.assertIn(module, ROLES[role or "server"], name)

    def test_role_modules_are_setup_cfg_ones(self) -> None:
        from verifier.tests.unit.test_install_roles import modules_of

        self.assertEqual(set(ROLES), set(extras.ROLE_MODULES))
        for role, modules in extras.ROLE_MODULES.items():
            self.assertEqual(modules_of([role]), set(modules), role)


class MissingRoleExtraTest(testtools.TestCase):
    def test_each_script_without_its_extra_says_so_in_one_line(self) -> None:
        checked = 0
        scripts = console_scripts()
        for name, (_, role) in launch.SCRIPTS.items():
            if role is None:
                continue
            target, hidden = scripts[name], extras.ROLE_MODULES[role]
            proc = run_hidden(target, hidden)
            self.assertEqual(2, proc.returncode, f"{name}: {proc.stderr[-2000:]}")
            self.assertEqual(
                f"{name}: needs the '{role}' extra: pip install "
                f"'trusted-cloud[{role}]' (missing module {hidden[0]})",
                proc.stderr.strip(),
                name,
            )
            self.assertEqual("", proc.stdout, name)
            checked += 1
        self.assertEqual(11, checked)

    def test_a_base_script_runs_without_any_role_extra(self) -> None:
        hidden = tuple(sorted({m for ms in extras.ROLE_MODULES.values() for m in ms}))
        for name in ("trusted-certs", "trusted-ima-policy"):
            proc = run_hidden(console_scripts()[name], hidden)
            self.assertEqual(0, proc.returncode, f"{name}: {proc.stderr[-2000:]}")
            self.assertTrue(proc.stdout.startswith(f"{name} "), proc.stdout)

    def test_a_script_with_its_extra_runs_its_command(self) -> None:
        self.assertIsNone(launch.missing_module("server"))
        out = self.useFixture(fixtures.StringStream("stdout"))
        self.useFixture(fixtures.MonkeyPatch("sys.stdout", out.stream))
        with testtools.ExpectedException(SystemExit, "0"):
            launch.launch("trusted-registrar", ["--version"])
        out.stream.flush()
        self.assertIn("trusted-registrar ", out.getDetails()["stdout"].as_text())

    def test_the_first_missing_module_is_named(self) -> None:
        proc = run_hidden(console_scripts()["trusted-revocation-listener"], ("uvloop",))
        self.assertEqual(2, proc.returncode, proc.stderr)
        self.assertIn("(missing module uvloop)", proc.stderr)
