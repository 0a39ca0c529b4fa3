"""A sample configuration per service, shipped and current, and a generator
command that works in that service's role.

``etc/oslo-config-generator/<command>.conf`` names the command's own
namespace and the libraries it configures; ``etc/<command>.conf.sample``
is its output (``tox -e genconfig``). The sections of the project's own
options must be exactly what the generator writes today (the libraries'
sections follow the installed libraries' versions, so only their names
are compared). Each generator configuration runs where its role's extra
alone is installed: in a fresh interpreter, the modules of the other
extras hidden and the namespaces of their distributions gone, as in a
venv of that role (``pip install 'trusted-cloud[server]'`` has no
tpm2-pytss: the ``node_agent`` namespace used to import the agent's TPM
stack and crash the generator there).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib import metadata

import fixtures
import testtools

from verifier.common import conf_files
from verifier.tests.unit.test_install_roles import MODULE_OF, ROOT, forbidden

GENERATOR_DIR = os.path.join(ROOT, "etc", "oslo-config-generator")
#: Command with a configuration file -> the role whose venv runs it.
ROLE_OF = {
    "trusted-registrar": "server",
    "trusted-verifier": "server",
    "trusted-keyservice": "server",
    "trusted-nova-listener": "server",
    "trusted-agent": "agent",
    "trusted-revocation-listener": "hooks",
    "trusted-vtpm-manager": "vtpm",
}
#: The project-wide generator configuration (devstack's, server role).
PROJECT_WIDE = os.path.join(ROOT, "etc", "trusted-cloud-config-generator.conf")

#: Hides modules and the namespaces of distributions (as not installed),
#: then runs oslo-config-generator.
_GENERATE = """
import json, re, sys
from importlib import metadata
hidden, dists, argv = json.loads(sys.argv[1])
for name in hidden:
    sys.modules[name] = None
from oslo_config import generator

def installed(namespace):
    return any(
        re.sub(r"[-_.]+", "-", point.dist.name).lower() not in dists
        for point in metadata.entry_points(group="oslo.config.opts", name=namespace)
        if point.dist is not None
    )

load = generator._get_raw_opts_loaders
generator._get_raw_opts_loaders = lambda names: load([n for n in names if installed(n)])
sys.exit(generator.main(argv))
"""


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def namespaces(config: str) -> list[str]:
    with open(config, encoding="utf-8") as handle:
        return [
            line.split("=", 1)[1].strip()
            for line in handle
            if line.startswith("namespace")
        ]


def sections(text: str) -> dict[str, str]:
    """A sample's sections: name -> its text (header included)."""
    found: dict[str, list[str]] = {}
    current: list[str] = []
    for line in text.splitlines(keepends=True):
        header = re.fullmatch(r"\[([^\]]+)\]\n?", line)
        if header:
            current = found.setdefault(header.group(1), [])
        current.append(line)
    return {name: "".join(lines) for name, lines in found.items()}


def own_groups(config: str) -> set[str]:
    """The groups the project's namespaces of ``config`` define."""
    groups: set[str] = set()
    for namespace in namespaces(config):
        if namespace.split(".")[0] not in (
            *conf_files.PROJECT_NAMESPACES,
            "trusted-cloud",
        ):
            continue
        [point] = metadata.entry_points(group="oslo.config.opts", name=namespace)
        for group, _ in point.load()():
            groups.add(str(getattr(group, "name", group) or "DEFAULT"))
    return groups


def generate(
    config: str, out: str, role: str | None = None
) -> subprocess.CompletedProcess[str]:
    hidden = forbidden([role]) if role else []
    module_dist = {module: dist for dist, module in MODULE_OF.items()}
    dists = sorted(_normalize(module_dist[m]) for m in hidden if m in module_dist)
    argv = ["--config-file", config, "--output-file", out]
    return subprocess.run(
        [sys.executable, "-c", _GENERATE, json.dumps([hidden, dists, argv])],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )


class SamplesTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.tmp = self.useFixture(fixtures.TempDir()).path

    def test_every_command_with_a_configuration_file_has_a_generator(self) -> None:
        configs = {n[: -len(".conf")] for n in os.listdir(GENERATOR_DIR)}
        self.assertEqual(set(ROLE_OF), configs)
        for command in ROLE_OF:
            config = os.path.join(GENERATOR_DIR, f"{command}.conf")
            with open(config, encoding="utf-8") as handle:
                self.assertIn(
                    f"output_file = etc/{command}.conf.sample\n", handle.read()
                )
            # what a command's configuration check knows (verifier.common.conf_files)
            for namespace in namespaces(config):
                if not namespace.startswith("trusted-cloud."):
                    self.assertIn(namespace, conf_files.NAMESPACES, command)

    def test_the_shipped_samples_are_current(self) -> None:
        for command in ROLE_OF:
            config = os.path.join(GENERATOR_DIR, f"{command}.conf")
            out = os.path.join(self.tmp, f"{command}.conf.sample")
            proc = generate(config, out)
            self.assertEqual(0, proc.returncode, proc.stderr[-3000:])
            with open(out, encoding="utf-8") as handle:
                fresh = sections(handle.read())
            with open(
                os.path.join(ROOT, "etc", f"{command}.conf.sample"), encoding="utf-8"
            ) as handle:
                shipped = sections(handle.read())
            stale = f"etc/{command}.conf.sample is stale: tox -e genconfig"
            self.assertEqual(sorted(fresh), sorted(shipped), stale)
            own = own_groups(config)
            self.assertTrue(own, command)
            for group in sorted(own):
                self.assertEqual(
                    fresh.get(group), shipped.get(group), f"{stale} [{group}]"
                )

    def test_each_generator_runs_with_its_role_extra_alone(self) -> None:
        for command, role in ROLE_OF.items():
            config = os.path.join(GENERATOR_DIR, f"{command}.conf")
            out = os.path.join(self.tmp, f"{command}.conf.sample")
            proc = generate(config, out, role)
            self.assertEqual(0, proc.returncode, f"{command}: {proc.stderr[-3000:]}")
            with open(out, encoding="utf-8") as handle:
                written = sections(handle.read())
            self.assertLessEqual(own_groups(config), set(written), command)

    def test_the_project_wide_generator_runs_in_a_server_venv(self) -> None:
        # devstack's: every option of the project, with the server extra
        out = os.path.join(self.tmp, "trusted-cloud.conf.sample")
        proc = generate(PROJECT_WIDE, out, "server")
        self.assertEqual(0, proc.returncode, proc.stderr[-3000:])
        with open(out, encoding="utf-8") as handle:
            written = sections(handle.read())
        for group in (
            "verifier",
            "registrar",
            "agent",
            "revocation_listener",
            "vtpm_manager",
        ):
            self.assertIn(group, written)
