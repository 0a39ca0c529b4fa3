"""doc/source/getting-started.rst runs as written.

Every ``.. code-block:: bash`` block of the page is taken in order and run
as one shell script (``set -euo pipefail``) with ``HOME`` a fresh
directory, in a copy of this checkout (the page says "from the top of a
checkout"; ``pip install .`` leaves build files in the tree it installs
from), with none of this test run's virtualenv, ``OS_*`` or ``TRUSTED_*``
settings in its environment. So the page's virtualenv is created and
filled from nothing (pip's cache is the machine's, as a newcomer's would
be on a second try), and its services, software TPM and Keystone really
run on the ports the page names (below 10000: the test harness hands out
ports from 10000 up, so no other test can hold them).

One block is not run: the ``apt-get`` line, which needs the package lists
and the dpkg lock of the machine (``make deps`` installs the same packages
from tools/apt-packages.txt; the test checks that every package the page
names is there).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile

import testtools

from trusted_testing.docpages import bash_blocks

ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
)
PAGE = os.path.join(ROOT, "doc", "source", "getting-started.rst")
APT_PACKAGES = os.path.join(ROOT, "tools", "apt-packages.txt")
#: what the whole page may take on a loaded 2-core machine (a fresh venv
#: with the server, agent and client extras, then Keystone)
TIMEOUT = 1500
#: what a copy of the checkout leaves out
_NOT_COPIED = shutil.ignore_patterns(
    ".venv", ".stestr", ".demo", "build", "*.egg-info", "__pycache__", ".tox"
)


def _apt_packages() -> set[str]:
    with open(APT_PACKAGES) as f:
        return {w for line in f for w in line.split("#")[0].split()}


def _clean_env(home: str) -> dict[str, str]:
    """This environment without our venv, Keystone or tenant settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OS_", "TRUSTED_", "PYTHON"))
        and k not in ("VIRTUAL_ENV", "PIP_REQUIRE_VIRTUALENV")
    }
    venv_bin = os.path.join(ROOT, ".venv", "bin")
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if p and p != venv_bin
    )
    real_home = os.path.expanduser("~")
    env.setdefault("PIP_CACHE_DIR", os.path.join(real_home, ".cache", "pip"))
    env["HOME"] = home
    return env


class GettingStartedTest(testtools.TestCase):
    """The guide, run as written (see the module doc)."""

    def test_the_page_has_blocks_and_names_only_installed_packages(self) -> None:
        with open(PAGE) as f:
            blocks = bash_blocks(f.read())
        self.assertGreater(len(blocks), 15)
        apt = [b for b in blocks if "apt-get" in b]
        self.assertEqual(1, len(apt))
        named = set(re.sub(r"\\\n", " ", apt[0]).split("install -y", 1)[1].split())
        self.assertEqual(set(), named - _apt_packages())

    def test_the_guide_runs_as_written(self) -> None:
        with open(PAGE) as f:
            blocks = [b for b in bash_blocks(f.read()) if "apt-get" not in b]
        tmp = tempfile.mkdtemp(prefix="getting-started-")
        self.addCleanup(shutil.rmtree, tmp, True)
        src = os.path.join(tmp, "checkout")
        shutil.copytree(ROOT, src, symlinks=True, ignore=_NOT_COPIED)
        home = os.path.join(tmp, "home")
        os.makedirs(home)
        script = os.path.join(tmp, "guide.sh")
        with open(script, "w") as f:
            f.write("set -euo pipefail\nPS4='+ guide: '\nset -x\n")
            f.write("\n\n".join(blocks) + "\n")
        out_path = os.path.join(tmp, "guide.out")
        with open(out_path, "wb") as out:
            proc = subprocess.Popen(
                ["bash", script],
                cwd=src,
                env=_clean_env(home),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                code = proc.wait(TIMEOUT)
            except subprocess.TimeoutExpired:
                code = None
            finally:
                # whatever the page left running (it stops all on success)
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
        with open(out_path, errors="replace") as f:
            output = f.read()
        trial = os.path.join(home, "trusted-trial")
        self.assertEqual(0, code, _failure(output, trial))
        # the story's milestones, as the page promises them
        self.assertIn("database password: s3cret", output)
        self.assertRegex(output, r"REVOKED")
        self.assertIn("unknown_file", output)
        with open(os.path.join(trial, "revocations.jsonl")) as f:
            records = [json.loads(line) for line in f if line.strip()]
        self.assertEqual(["node.revoked"], [r["type"] for r in records])
        self.assertIn("miner.sh", records[0]["detail"])
        with open(os.path.join(trial, "agent-before-reboot.log")) as f:
            self.assertIn("TRIAL MODE", f.read())
        self.assertNotIn("Traceback", output)


def _failure(output: str, trial: str) -> str:
    """The script's last lines and the services' logs' last lines."""
    parts = [f"--- guide output (last 6000 chars):\n{output[-6000:]}"]
    for name in (
        "registrar.log",
        "verifier.log",
        "agent.log",
        "tpm.log",
        "keystone/keystone.log",
    ):
        path = os.path.join(trial, name)
        if os.path.exists(path):
            with open(path, errors="replace") as f:
                parts.append(f"--- {name}:\n{f.read()[-3000:]}")
    return "\n".join(parts)
