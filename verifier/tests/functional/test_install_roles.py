"""The wheel, installed per role in a venv of its own: ``pip install
'trusted-cloud[agent]'`` and ``[client]`` bring none of the other roles'
packages, and their commands run.

The wheel is built once per test process (``pip wheel``, checked for
setuptools' "Package would be ignored" and for the test harness, which
must not ship); each class installs it with its extra. The venvs are kept under
``~/.cache/trusted-cloud/role-venvs/``, keyed by the role, the interpreter
and the wheel's requirements: a rerun reinstalls only the project (and
lets pip resolve the extra again), a change of requirements builds a fresh
venv. The figures of every role are printed by ``tools/role_footprint.py``.
"""

from __future__ import annotations

import atexit
import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from typing import IO, TYPE_CHECKING, ClassVar

import testtools

from verifier.common import extras, launch
from verifier.tests.unit.test_install_roles import ROLES, ROOT, forbidden, modules_of

CACHE = os.path.join(os.path.expanduser("~"), ".cache", "trusted-cloud", "role-venvs")
#: Where the harness lived before it became the unshipped trusted_testing.
OLD_HARNESS = (
    "verifier/testing/",
    "verifier/tests/fixtures/",
    "verifier/protocol/mb/testing.py",
    "verifier/protocol/ima/testing.py",
    "vtpm_manager/testing.py",
    "node_agent/swtpm.py",
)
#: Module -> distribution, for the modules of the extras and of nova.
DIST_OF = {
    "horizon": "horizon",
    "django": "Django",
    "oslo_limit": "oslo.limit",
    "oslo_log": "oslo.log",
    "tpm2_pytss": "tpm2-pytss",
    "keystoneauth1": "keystoneauth1",
    "novaclient": "python-novaclient",
    "osc_lib": "osc-lib",
    "openstackclient": "python-openstackclient",
    "sqlalchemy": "sqlalchemy",
    "alembic": "alembic",
    "uvloop": "uvloop",
    "libvirt": "libvirt-python",
    "pymcl": "pymcl",
    "oslo_messaging": "oslo.messaging",
    "tooz": "tooz",
    "redis": "redis",
    "psycopg": "psycopg",
    "pymysql": "pymysql",
    "hvac": "hvac",
    "vici": "vici",
    "keystonemiddleware": "keystonemiddleware",
    "oslo_policy": "oslo.policy",
    "debian": "python-debian",
    "zstandard": "zstandard",
    "prometheus_client": "prometheus-client",
    "nova": "nova",
}


def _run(argv: list[str], timeout: float = 600, **kw: object) -> str:
    proc = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=timeout,
        **kw,  # type: ignore[call-overload]
    )
    if proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stderr[-3000:]}"
        )
    return str(proc.stdout) + str(proc.stderr)


@functools.cache
def built_wheel() -> tuple[str, str]:
    """The wheel of the checkout, built once per test process (its
    directory is removed when the process ends)."""
    dest = tempfile.mkdtemp(prefix="test-install-wheel-")
    atexit.register(shutil.rmtree, dest, True)
    return build_wheel(dest)


def build_wheel(dest: str) -> tuple[str, str]:
    """(path of the wheel built from the checkout, the build's output).

    setuptools builds in ``dest`` (``DIST_EXTRA_CONFIG``), not in the
    checkout's ``build/``, whose stale files (modules since moved or
    deleted) would end up in the wheel. One build at a time: pbr writes its
    metadata into the checkout.
    """
    config = os.path.join(dest, "build.cfg")
    with open(config, "w", encoding="utf-8") as f:
        f.write(f"[build]\nbuild_base = {os.path.join(dest, 'build')}\n")
    env = {**os.environ, "DIST_EXTRA_CONFIG": config}
    os.makedirs(CACHE, exist_ok=True)
    with open(os.path.join(CACHE, "build.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        log = _run(
            [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "-w", dest, ROOT],
            env=env,
        )
    [name] = [n for n in os.listdir(dest) if n.endswith(".whl")]
    return os.path.join(dest, name), log


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_requirements(wheel: str) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        [meta] = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        text = z.read(meta).decode()
    return sorted(
        line for line in text.splitlines() if line.startswith("Requires-Dist:")
    )


class RoleVenv:
    """A venv with the wheel installed with one extra (see the module doc).

    Holds an exclusive lock on the role's cache until :meth:`close`.
    """

    def __init__(self, role: str, wheel: str) -> None:
        self.role = role
        os.makedirs(CACHE, exist_ok=True)
        self._lock: IO[str] = open(os.path.join(CACHE, f"{role}.lock"), "w")  # noqa: SIM115
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        key = hashlib.sha256(
            json.dumps([role, sys.version, wheel_requirements(wheel)]).encode()
        ).hexdigest()[:16]
        self.path = os.path.join(CACHE, f"{role}-{key}")
        self.reused = os.path.exists(os.path.join(self.path, ".complete"))
        if self.reused:
            self.pip("install", "--force-reinstall", "--no-deps", wheel)
        else:
            self._create()
        self.pip("install", f"{wheel}[{role}]")  # a rerun: every requirement met
        self.pip("check")
        open(os.path.join(self.path, ".complete"), "w").close()  # noqa: SIM115

    def _create(self) -> None:
        for name in os.listdir(CACHE):  # older requirements of this role
            if name.startswith(f"{self.role}-"):
                shutil.rmtree(os.path.join(CACHE, name), ignore_errors=True)
        _run([sys.executable, "-m", "venv", self.path])
        self.pip("install", "--upgrade", "pip")

    def bin(self, name: str) -> str:
        return os.path.join(self.path, "bin", name)

    def pip(self, *args: str) -> str:
        return _run([self.bin("python"), "-m", "pip", "-q", *args])

    def installed(self) -> set[str]:
        """Normalized names of every installed distribution."""
        out = _run([self.bin("python"), "-m", "pip", "list", "--format", "json"])
        start = out.index("[")
        items = json.JSONDecoder().raw_decode(out[start:])[0]
        return {_normalize(item["name"]) for item in items}

    def run(
        self, *argv: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=120,
            cwd=self.path,  # not the checkout: import what was installed
            env={**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})},
        )

    def close(self) -> None:
        self._lock.close()


# A mixin, so that the loader does not collect it as tests of its own.
if TYPE_CHECKING:
    _Base = testtools.TestCase
else:
    _Base = object


class _RoleChecks(_Base):
    """What every role's install must pass (the test classes below are also
    ``testtools.TestCase``)."""

    ROLE: ClassVar[str]
    venv: ClassVar[RoleVenv]
    wheel: ClassVar[str]
    build_log: ClassVar[str]

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.wheel, cls.build_log = built_wheel()
        cls.venv = RoleVenv(cls.ROLE, cls.wheel)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.venv.close()
        super().tearDownClass()

    def test_wheel_builds_without_ignored_packages(self) -> None:
        self.assertIn("Building wheel for trusted-cloud", self.build_log)
        self.assertNotIn("Package would be ignored", self.build_log)

    def test_wheel_ships_no_test_harness(self) -> None:
        with zipfile.ZipFile(self.wheel) as z:
            names = z.namelist()
        self.assertIn("node_agent/cmd.py", names)
        self.assertEqual([], [n for n in names if n.startswith("trusted_testing/")])
        self.assertEqual([], [n for n in names if n.startswith(OLD_HARNESS)])

    def test_installs_no_package_of_another_role(self) -> None:
        installed = self.venv.installed()
        self.assertIn("trusted-cloud", installed)
        unwanted = {_normalize(DIST_OF[m]) for m in forbidden([self.ROLE])}
        self.assertEqual(set(), installed & unwanted)

    def test_other_roles_scripts_name_their_extra(self) -> None:
        # every console script is installed in every role: another role's
        # says in one line which extra it needs (verifier.common.launch)
        own = modules_of([self.ROLE])
        checked = []
        for script, (_, role) in launch.SCRIPTS.items():
            needed = extras.ROLE_MODULES.get(role or "", ())
            absent = [m for m in needed if m not in own]
            if role is None or role == self.ROLE or not absent:
                continue
            proc = self.venv.run(self.venv.bin(script), "--version")
            line = proc.stderr.strip()
            self.assertEqual(2, proc.returncode, f"{script}: {proc.stderr[-2000:]}")
            self.assertEqual(1, len(line.splitlines()), f"{script}: {line}")
            prefix = (
                f"{script}: needs the '{role}' extra: "
                f"pip install 'trusted-cloud[{role}]' (missing module "
            )
            self.assertTrue(line.startswith(prefix), f"{script}: {line}")
            self.assertIn(line[len(prefix) : -1], absent, line)
            self.assertEqual("", proc.stdout, script)
            checked.append(script)
        self.assertGreaterEqual(len(checked), 6, checked)

    def run_ok(self, *argv: str) -> str:
        proc = self.venv.run(*argv)
        self.assertEqual(0, proc.returncode, proc.stderr[-2000:])
        return proc.stdout


class AgentRoleTest(_RoleChecks, testtools.TestCase):
    ROLE = "agent"

    def test_own_packages_are_installed(self) -> None:
        self.assertLessEqual({"tpm2-pytss", "oslo-log"}, self.venv.installed())

    def test_trusted_agent_help(self) -> None:
        self.assertIn(
            "usage: trusted-agent",
            self.run_ok(self.venv.bin("trusted-agent"), "--help"),
        )

    def test_cp_abe_routes_answer_501_naming_the_abe_extra(self) -> None:
        out = self.run_ok(self.venv.bin("python"), "-c", _AGENT_ABE_PROBE)
        status, body = json.loads(out.strip().splitlines()[-1])
        self.assertEqual(501, status)
        self.assertEqual("extra_not_installed", body["error"]["code"])
        self.assertIn("pip install 'trusted-cloud[abe]'", body["error"]["message"])


class ClientRoleTest(_RoleChecks, testtools.TestCase):
    ROLE = "client"

    def test_own_packages_are_installed(self) -> None:
        self.assertLessEqual(
            {
                "python-novaclient",
                "osc-lib",
                "python-openstackclient",
                "python-debian",
                "zstandard",
            },
            self.venv.installed(),
        )

    def test_policy_generate_from_debs(self) -> None:
        from trusted_testing.debrepo import build_deb

        with tempfile.TemporaryDirectory() as work:
            debs = [
                build_deb(work, name, "1", {"/usr/bin/" + name: b"x"}, compression=z)
                for name, z in (("a", "xz"), ("b", "zstd"))
            ]
            out = os.path.join(work, "policy.json")
            self.run_ok(
                self.venv.bin("trusted-tenant"), "policy", "generate", "runtime",
                "--deb", *debs, "--name", "p", "-o", out,
            )  # fmt: skip
            with open(out, encoding="utf-8") as handle:
                self.assertIn("/usr/bin/b", json.load(handle)["digests"])

    def test_trusted_tenant_and_trusted_nova_help(self) -> None:
        self.assertIn(
            "usage: trusted-tenant",
            self.run_ok(self.venv.bin("trusted-tenant"), "--help"),
        )
        self.assertIn(
            "usage: trusted-nova", self.run_ok(self.venv.bin("trusted-nova"), "--help")
        )

    def test_openstack_trusted_server_create_help(self) -> None:
        out = self.run_ok(
            self.venv.bin("openstack"), "help", "trusted", "server", "create"
        )
        self.assertIn("usage: openstack trusted server create", out)
        self.assertIn("--wait", out)

    def test_seal_names_the_abe_extra(self) -> None:
        proc = self.venv.run(
            self.venv.bin("trusted-tenant"),
            "--verifier=https://127.0.0.1:1",
            "seal",
            "--seal-policy=region=eu",
            "--payload=/nonexistent",
            "--out=/nonexistent",
        )
        self.assertEqual(2, proc.returncode, proc.stderr)
        self.assertEqual(1, len(proc.stderr.strip().splitlines()), proc.stderr)
        self.assertIn("pip install 'trusted-cloud[abe]'", proc.stderr)

    def test_client_modules_load_no_server_or_host_module(self) -> None:
        modules = ", ".join(ROLES["client"])
        out = self.run_ok(
            self.venv.bin("python"),
            "-c",
            f"import sys, {modules}\n"
            "print(sorted(m for m in ('sqlalchemy', 'alembic', 'libvirt', "
            "'tpm2_pytss', 'oslo_messaging') if m in sys.modules))",
        )
        self.assertEqual("[]", out.strip().splitlines()[-1])


#: In the agent's venv (no pymcl): an agent app answers GET /v1/abe.
_AGENT_ABE_PROBE = """
import asyncio, json, tempfile, uuid
from aiohttp.test_utils import TestClient, TestServer
from node_agent.agent import Agent
from node_agent.server import make_app
from verifier.common.tpm_access import TpmAccess

def no_tpm():
    raise RuntimeError("this check uses no TPM")

async def main():
    work = tempfile.mkdtemp()
    agent = Agent(str(uuid.uuid4()), TpmAccess(no_tpm, shared=True), work)
    client = TestClient(TestServer(make_app(agent), host="127.0.0.1"))
    await client.start_server()
    try:
        resp = await client.get("/v1/abe")
        print(json.dumps([resp.status, await resp.json()]))
    finally:
        await client.close()

asyncio.run(main())
"""
