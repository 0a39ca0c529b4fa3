"""Each role installs only what it imports (setup.cfg ``[extras]``).

Importing a role's entry modules in a fresh interpreter must not load a
module that only another role's extra (or an optional driver's extra)
installs: on a machine with ``pip install 'trusted-cloud[agent]'`` that
import would fail. And no product package imports another's internals:
only the protocol core and the shared plumbing cross package lines.
"""

from __future__ import annotations

import ast
import configparser
import json
import os
import re
import subprocess
import sys

import testtools

from verifier.common import extras

ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
)
PRODUCT = (
    "verifier",
    "node_agent",
    "nova_plugin",
    "vtpm_manager",
    "ipsec_puppet_vault_hooks",
    "attestation_dashboard",
)
HARNESS = "trusted_testing"
SHARED = ("verifier.protocol", "verifier.common")

#: Distribution of each extra's requirement -> the module it provides.
MODULE_OF = {
    "oslo.log": "oslo_log",
    "tpm2-pytss": "tpm2_pytss",
    "keystoneauth1": "keystoneauth1",
    "python-novaclient": "novaclient",
    "osc-lib": "osc_lib",
    "python-openstackclient": "openstackclient",
    "SQLAlchemy": "sqlalchemy",
    "alembic": "alembic",
    "uvloop": "uvloop",
    "libvirt-python": "libvirt",
    "pymcl": "pymcl",
    "oslo.messaging": "oslo_messaging",
    "tooz": "tooz",
    "redis": "redis",
    "psycopg": "psycopg",
    "PyMySQL": "pymysql",
    "hvac": "hvac",
    "vici": "vici",
    "keystonemiddleware": "keystonemiddleware",
    "oslo.policy": "oslo_policy",
    "oslo.limit": "oslo_limit",
    "python-debian": "debian",
    "zstandard": "zstandard",
    "prometheus-client": "prometheus_client",
    "horizon": "horizon",
    "Django": "django",
}
#: Installed by a test requirement only: no role may import it.
TEST_ONLY = ("nova",)
#: oslo.config (base) imports oslo.log whenever it is installed; openstacksdk
#: (Horizon's) imports prometheus_client whenever it is installed.
OPPORTUNISTIC = ("oslo_log", "prometheus_client")

#: Role -> the modules its console scripts and default plugins load.
ROLES = {
    "agent": ["node_agent.cmd", "node_agent.server", "node_agent.trial.cli"],
    "client": ["nova_plugin.cmd", "nova_plugin.nova_cmd", "nova_plugin.osc"],
    "server": [
        "verifier.cmd.registrar",
        "verifier.cmd.verifier",
        "verifier.cmd.keyservice",
        "verifier.cmd.certs",
        "verifier.cmd.ima_policy",
        "verifier.cmd.nova_listener",
        "verifier.notify.drivers",
        "verifier.notify.webhook",
        "verifier.notify.keyservice",
        "ipsec_puppet_vault_hooks.inprocess",
        "vtpm_manager.instance_hook",
    ],
    "hooks": [
        "ipsec_puppet_vault_hooks.cmd.listener",
        "ipsec_puppet_vault_hooks.autosign",
        "ipsec_puppet_vault_hooks.actions.noop",
        "ipsec_puppet_vault_hooks.actions.log",
        "ipsec_puppet_vault_hooks.actions.puppet",
    ],
    "vtpm": ["vtpm_manager.cmd", "vtpm_manager.hook"],
    # Horizon's panels: Django set up with the plugin's test settings
    # (Horizon's own), then every view module
    "dashboard": [
        "attestation_dashboard.tests.unit",
        "attestation_dashboard.content.nodes.views",
        "attestation_dashboard.content.policies.views",
        "attestation_dashboard.content.admin.views",
        "attestation_dashboard.apps",
    ],
}

#: (role, driver extra) -> the modules that need that driver.
DRIVERS = {
    ("agent", "abe"): ["node_agent.abe"],
    ("server", "abe"): ["verifier.attest.abe_keys", "verifier.api.abe_app"],
    ("server", "messaging"): ["verifier.notify.messaging", "verifier.nova_listener"],
    ("server", "tpm"): ["verifier.common.tpm", "verifier.attest.monitor"],
    ("server", "scale"): ["verifier.attest.ownership"],
    ("server", "limits"): ["verifier.attest.keystone_limits"],
    ("hooks", "messaging"): ["ipsec_puppet_vault_hooks.messaging"],
    ("hooks", "vault"): ["ipsec_puppet_vault_hooks.actions.vault"],
    ("hooks", "ipsec"): ["ipsec_puppet_vault_hooks.actions.ipsec"],
}

_PROBE = (
    "import importlib, json, sys\n"
    "for name in sys.argv[2:]:\n"
    "    importlib.import_module(name)\n"
    "bad = json.loads(sys.argv[1])\n"
    "print(json.dumps(sorted(m for m in bad if m in sys.modules)))\n"
)


def setup_cfg_extras() -> dict[str, list[str]]:
    """setup.cfg's extras: name -> distribution names (no versions)."""
    parser = configparser.ConfigParser()
    parser.read(os.path.join(ROOT, "setup.cfg"))
    return {
        name: [
            re.split(r"[\[<>=!~; ]", line.strip(), maxsplit=1)[0]
            for line in value.splitlines()
            if line.strip()
        ]
        for name, value in parser["extras"].items()
    }


def modules_of(extra_names: list[str]) -> set[str]:
    table = setup_cfg_extras()
    return {MODULE_OF[dist] for name in extra_names for dist in table[name]}


def forbidden(allowed_extras: list[str]) -> list[str]:
    """Modules only other extras (or the test requirements) install."""
    every = modules_of(list(setup_cfg_extras())) | set(TEST_ONLY)
    return sorted(every - modules_of(allowed_extras) - set(OPPORTUNISTIC))


def loaded(modules: list[str], bad: list[str]) -> list[str]:
    """Which of ``bad`` a fresh interpreter has loaded after ``modules``."""
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(bad), *modules],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    if proc.returncode != 0:
        raise AssertionError(f"importing {modules} failed:\n{proc.stderr[-2000:]}")
    result: list[str] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


class ExtrasTableTest(testtools.TestCase):
    """The guard below knows every requirement of every extra."""

    def test_every_extra_requirement_has_a_module(self) -> None:
        dists = {d for ds in setup_cfg_extras().values() for d in ds}
        self.assertEqual(set(MODULE_OF), dists)

    def test_role_and_driver_extras_are_the_setup_cfg_ones(self) -> None:
        names = set(setup_cfg_extras())
        self.assertEqual(names, set(ROLES) | set(extras.DRIVER_MODULES))

    def test_missing_extra_messages_name_the_right_modules(self) -> None:
        for extra, modules in extras.DRIVER_MODULES.items():
            self.assertEqual(set(modules), modules_of([extra]), extra)


def install_rst_table() -> dict[str, tuple[str, list[str]]]:
    """doc/source/install.rst's "What each role installs" table: extra ->
    (its "for" column, the distributions of its "adds" column)."""
    with open(os.path.join(ROOT, "doc", "source", "install.rst")) as f:
        text = f.read()
    section = text.split("What each role installs\n", 1)[1]
    lines = section.splitlines()
    rules = [i for i, line in enumerate(lines) if re.fullmatch(r"=+( +=+)+", line)]
    header, body, end = rules[0], rules[1], rules[2]
    columns = [m.start() for m in re.finditer(r"=+", lines[header])]
    rows: dict[str, list[str]] = {}
    last = ""
    for line in lines[body + 1 : end]:
        cells = [
            line[a:b].strip()
            for a, b in zip(columns, [*columns[1:], None], strict=True)
        ]
        if cells[0]:
            last = cells[0]
            rows[last] = [cells[1], cells[2]]
        else:
            rows[last][0] += " " + cells[1]
            rows[last][1] += " " + cells[2]
    table = {}
    for extra, (used_for, adds) in rows.items():
        adds = re.sub(r"\(.*?\)", "", adds)  # notes such as "(and gpgv ...)"
        dists = [re.sub(r"\[.*\]", "", d).strip() for d in adds.split(",")]
        table[extra] = (used_for, [d for d in dists if d])
    return table


class InstallDocTableTest(testtools.TestCase):
    """install.rst's role table is setup.cfg's extras (issue 33: it was
    stale: the server's Keystone and policy libraries, the hooks'
    prometheus-client and the whole ``limits`` extra were missing)."""

    def test_the_table_lists_each_extra_with_what_it_adds(self) -> None:
        table = install_rst_table()
        cfg = setup_cfg_extras()
        self.assertEqual(list(cfg), list(table))
        for extra, dists in cfg.items():
            self.assertEqual(sorted(dists), sorted(table[extra][1]), extra)

    def test_each_console_script_is_in_its_role_row(self) -> None:
        from verifier.common.launch import SCRIPTS

        table = install_rst_table()
        for script, (_, role) in SCRIPTS.items():
            rows = [
                e for e, (used_for, _) in table.items() if f"``{script}``" in used_for
            ]
            if role is None:
                self.assertEqual([], rows, f"{script} needs no extra")
            else:
                self.assertIn(role, rows, script)


class RoleImportsTest(testtools.TestCase):
    """A fresh interpreter imports each role's modules and nothing of the
    others' extras."""

    def check_role(self, role: str) -> None:
        bad = forbidden([role])
        self.assertGreater(len(bad), 8)
        self.assertEqual([], loaded(ROLES[role], bad), f"role {role}")

    def test_agent(self) -> None:
        bad = forbidden(["agent"])
        for module in ("sqlalchemy", "libvirt", "novaclient", "keystoneauth1"):
            self.assertIn(module, bad)
        self.check_role("agent")

    def test_client(self) -> None:
        bad = forbidden(["client"])
        for module in ("sqlalchemy", "alembic", "libvirt", "tpm2_pytss", "pymcl"):
            self.assertIn(module, bad)
        self.check_role("client")

    def test_server(self) -> None:
        self.assertIn("libvirt", forbidden(["server"]))
        self.check_role("server")

    def test_hooks(self) -> None:
        self.assertIn("sqlalchemy", forbidden(["hooks"]))
        self.check_role("hooks")

    def test_dashboard(self) -> None:
        bad = forbidden(["dashboard"])
        for module in ("sqlalchemy", "libvirt", "tpm2_pytss", "oslo_messaging"):
            self.assertIn(module, bad)
        self.check_role("dashboard")

    def test_vtpm(self) -> None:
        self.assertIn("sqlalchemy", forbidden(["vtpm"]))
        self.check_role("vtpm")

    def test_the_console_scripts_launcher_loads_no_extra(self) -> None:
        # every script enters through it, in every role, before its role's
        # modules are checked (verifier.common.launch)
        self.assertEqual([], loaded(["verifier.common.launch"], forbidden([])))

    def test_drivers_import_only_their_own_extra(self) -> None:
        for (role, driver), modules in DRIVERS.items():
            bad = forbidden([role, driver])
            self.assertEqual([], loaded(modules, bad), f"{role} + {driver}")

    def test_the_probe_sees_a_forbidden_import(self) -> None:
        # the guard itself: a module that does import SQLAlchemy is caught
        found = loaded(["verifier.db"], forbidden(["agent"]))
        self.assertIn("sqlalchemy", found)
        self.assertIn("alembic", found)


def _imports(path: str, module: str) -> list[str]:
    """Every module ``path`` imports (any depth), absolute dotted names."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    package = (
        module.split(".") if path.endswith("__init__.py") else module.split(".")[:-1]
    )
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package[: len(package) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            # ``from verifier import db`` imports verifier.db
            found.extend(f"{base}.{alias.name}" for alias in node.names)
    return found


def _product_modules() -> list[tuple[str, str]]:
    out = []
    for package in PRODUCT:
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, package)):
            dirnames[:] = [d for d in dirnames if d not in ("tests", "__pycache__")]
            for name in filenames:
                if name.endswith(".py"):
                    path = os.path.join(dirpath, name)
                    rel = os.path.relpath(path, ROOT)[: -len(".py")]
                    module = rel.replace(os.sep, ".").removesuffix(".__init__")
                    out.append((path, module))
    return out


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def violation(module: str, imported: str) -> str | None:
    """Why ``module`` may not import ``imported`` (None: it may)."""
    own = module.split(".")[0]
    top = imported.split(".")[0]
    if top == HARNESS:
        return "the test harness is not shipped"
    if top not in PRODUCT:
        return None
    if _within(module, "verifier.protocol"):
        ok = _within(imported, "verifier.protocol")
        return None if ok else "the protocol core imports nothing of ours"
    if _within(module, "verifier.common"):
        ok = any(_within(imported, p) for p in SHARED)
        return None if ok else "the shared plumbing imports only the protocol core"
    if top == own or any(_within(imported, p) for p in SHARED):
        return None
    return "another package's internals"


class PackageBoundariesTest(testtools.TestCase):
    """No product module imports another package's internals (only
    verifier.protocol and verifier.common cross package lines; plugins of
    another package are named by stevedore entry points, not imported) nor
    the test harness."""

    def test_the_rules(self) -> None:
        self.assertIsNone(
            violation("nova_plugin.tenant", "verifier.common.agent_client")
        )
        self.assertIsNone(violation("verifier.cmd.verifier", "verifier.db"))
        self.assertIsNotNone(violation("nova_plugin.tenant", "verifier.attest"))
        self.assertIsNotNone(violation("node_agent.cmd", "trusted_testing.swtpm"))
        self.assertIsNotNone(violation("verifier.common.tls", "verifier.exceptions"))
        self.assertIsNotNone(violation("verifier.protocol.tpm", "verifier.common"))

    def test_no_cross_package_internals(self) -> None:
        modules = _product_modules()
        self.assertGreater(len(modules), 150)
        bad = [
            f"{module} imports {imported}: {why}"
            for path, module in modules
            for imported in _imports(path, module)
            if (why := violation(module, imported)) is not None
        ]
        self.assertEqual([], bad)
