"""The shipped systemd units (``etc/systemd``, doc/source/admin/systemd.rst)
checked with the real ``systemd-analyze``.

``systemd-analyze verify`` needs no booted systemd: given unit files by
path it loads them (and their ``NAME.service.d/*.conf`` drop-ins, next to
them) and checks every directive, and that each ``ExecStart`` is an
executable. The units name ``/opt/trusted-cloud/bin`` (install.rst's
virtualenv); the test copies them with that directory replaced by the
scripts of the Python running the tests, so the binaries are real ones.
"""

from __future__ import annotations

import configparser
import os
import re
import shutil
import subprocess
import sys
import tempfile

import testtools

from verifier.common import launch

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
UNITS = os.path.join(REPO, "etc", "systemd")
PAGE = os.path.join(REPO, "doc", "source", "admin", "systemd.rst")
BIN = os.path.dirname(sys.executable)
SHIPPED_BIN = "/opt/trusted-cloud/bin"
ANALYZE = shutil.which("systemd-analyze")

#: The console scripts that run as daemons (each gets a unit); the others
#: are commands an operator, a tenant or a libvirt hook runs and that exit.
DAEMONS = {
    "trusted-registrar",
    "trusted-verifier",
    "trusted-keyservice",
    "trusted-agent",
    "trusted-revocation-listener",
    "trusted-nova-listener",
}
COMMANDS = {
    "trusted-certs",
    "trusted-ima-policy",
    "trusted-tenant",
    "trusted-nova",
    "trusted-puppet-autosign",
    "trusted-vtpm-manager",
    # trial mode: serves a software TPM in the foreground for a first try,
    # never a production daemon (doc/source/getting-started.rst)
    "trusted-trial",
}


def _unit(path: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(path)
    return parser


@testtools.skipIf(ANALYZE is None, "systemd-analyze is not installed (apt systemd)")
class SystemdUnitsTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.dir = tempfile.mkdtemp(prefix="trusted-units-")
        self.addCleanup(shutil.rmtree, self.dir, True)

    def install(self, name: str, text: str | None = None) -> str:
        """The shipped unit ``name`` (or ``text``) in the test's directory,
        with its ExecStart at this Python's scripts."""
        if text is None:
            with open(os.path.join(UNITS, name)) as f:
                text = f.read()
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write(text.replace(SHIPPED_BIN, BIN))
        return path

    def verify(self, *paths: str) -> tuple[int, str]:
        assert ANALYZE is not None
        proc = subprocess.run(
            [ANALYZE, "verify", "--man=no", *paths],
            capture_output=True,
            text=True,
            timeout=120,
        )
        return proc.returncode, proc.stdout + proc.stderr

    def test_every_daemon_has_a_unit_and_every_script_is_classified(self) -> None:
        self.assertEqual(set(launch.SCRIPTS), DAEMONS | COMMANDS)
        self.assertEqual(
            sorted(f"{name}.service" for name in DAEMONS), sorted(os.listdir(UNITS))
        )
        for name in DAEMONS:
            service = _unit(os.path.join(UNITS, f"{name}.service"))["Service"]
            conf = name.replace("trusted-", "")
            self.assertEqual(
                f"{SHIPPED_BIN}/{name} --config-file /etc/trusted-cloud/{conf}.conf",
                service["ExecStart"],
            )
            self.assertEqual("simple", service["Type"])
            self.assertEqual("on-failure", service["Restart"])
            # a configuration error (exit 2) is not restarted in a loop
            self.assertEqual("2", service["RestartPreventExitStatus"])
            self.assertNotEqual("root", service.get("User", "root"))
            self.assertEqual("strict", service["ProtectSystem"])
            self.assertEqual("yes", service["NoNewPrivileges"])

    def test_units_pass_systemd_analyze_verify(self) -> None:
        paths = [self.install(f"{name}.service") for name in sorted(DAEMONS)]
        self.assertEqual((0, ""), self.verify(*paths))

    def test_verify_catches_what_the_test_relies_on(self) -> None:
        # the check above can fail: a missing binary fails verify, and a
        # misspelt directive is reported (the test wants no output at all)
        with open(os.path.join(UNITS, "trusted-verifier.service")) as f:
            text = f.read()
        missing = self.install(
            "missing.service", text.replace("trusted-verifier ", "nope ")
        )
        rc, out = self.verify(missing)
        self.assertNotEqual(0, rc)
        self.assertIn("nope", out)
        typo = self.install("typo.service", text.replace("PrivateTmp=", "PrivatTmp="))
        rc, out = self.verify(typo)
        self.assertIn("Unknown key 'PrivatTmp'", out)

    def test_hardening_rates_ok_with_systemd_analyze_security(self) -> None:
        assert ANALYZE is not None
        for name in sorted(DAEMONS):
            path = self.install(f"{name}.service")
            proc = subprocess.run(
                [ANALYZE, "security", "--offline=true", "--no-pager", path],
                capture_output=True,
                text=True,
                timeout=120,
            )
            found = re.search(r"Overall exposure level for \S+: ([0-9.]+) (\w+)",
                              proc.stdout)  # fmt: skip
            self.assertIsNotNone(found, proc.stdout[-2000:] + proc.stderr)
            assert found is not None
            # systemd's scale: 0 (locked down) .. 10 (unprotected); OK < 4.5
            self.assertLess(float(found.group(1)), 3.0, name)

    def test_the_pages_drop_in_verifies(self) -> None:
        # the drop-in doc/source/admin/systemd.rst shows, as written (with
        # its ExecStart at this Python's scripts)
        with open(PAGE) as f:
            page = f.read()
        block = re.search(
            r"``/etc/systemd/system/trusted-verifier\.service\.d/local\.conf``::\n\n"
            r"((?:    .*\n|\n)+)",
            page,
        )
        self.assertIsNotNone(block, "the drop-in example is gone from the page")
        assert block is not None
        dropin = "\n".join(line[4:] for line in block.group(1).splitlines()) + "\n"
        unit = self.install("trusted-verifier.service")
        os.makedirs(f"{unit}.d")
        with open(os.path.join(f"{unit}.d", "local.conf"), "w") as f:
            f.write(dropin.replace(SHIPPED_BIN, BIN))
        self.assertEqual((0, ""), self.verify(unit))
        # and systemd really reads it: a broken ExecStart in it fails
        with open(os.path.join(f"{unit}.d", "local.conf"), "a") as f:
            f.write("ExecStart=\nExecStart=/nonexistent/trusted-verifier\n")
        self.assertNotEqual(0, self.verify(unit)[0])
