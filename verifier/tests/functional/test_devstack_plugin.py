"""The DevStack plugin (``devstack/settings``, ``devstack/plugin.sh``), phase
by phase, without DevStack.

DevStack cannot run here, so ``devstack/tests/fake-functions.sh`` stands in
for its function library: it records every call, writes ini files for real,
and really starts the registrar and the verifier for ``run_process``. Each
phase runs in a fresh ``bash -eu`` that sources the fake library, the
settings and ``plugin.sh <mode> <phase>``, the way ``stack.sh`` /
``unstack.sh`` / ``clean.sh`` do. ``trusted-certs`` and
``oslo-config-generator`` run for real, into a temporary directory; the
written configuration is checked against the real oslo.config options.
"""

from __future__ import annotations

import configparser
import getpass
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time

import fixtures
import requests
import testtools
from cryptography import x509
from oslo_config import cfg
from oslo_log import log as oslo_log

import ipsec_puppet_vault_hooks.conf.opts as hooks_opts
import node_agent.conf.opts as agent_opts
import verifier.conf.opts as verifier_opts
from trusted_testing.cluster import free_port

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
DEVSTACK = os.path.join(REPO, "devstack")
SYSTEMD = os.path.join(REPO, "etc", "systemd")
BIN = os.path.dirname(sys.executable)

# What the fake does for a phase; "$0" and "$1" are the files to source.
_PHASE = (
    'set -eu -o pipefail; source "$0"; source "$1"; '
    'plugin=$2; shift 2; source "$plugin" "$@"'
)


def _option_names(opts: list[tuple[object, list[cfg.Opt]]]) -> dict[str, set[str]]:
    """``{group name: {option names}}`` from a ``list_opts()`` result."""
    names: dict[str, set[str]] = {}
    for group, group_opts in opts:
        name = group.name if isinstance(group, cfg.OptGroup) else str(group)
        names.setdefault(name, set()).update(o.dest for o in group_opts)
    return names


def _real_options() -> dict[str, set[str]]:
    """Every option the services read: ours, by group, and oslo.log's."""
    names = _option_names(
        verifier_opts.list_opts() + hooks_opts.list_opts() + agent_opts.list_opts()
    )
    log_conf = cfg.ConfigOpts()
    oslo_log.register_options(log_conf)
    names["DEFAULT"] = set(log_conf)  # a ConfigOpts maps its option names
    return names


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


class FakeDevstack(fixtures.Fixture):
    """A DevStack-like environment in a temporary directory.

    ``DEST/trusted-cloud`` is a link to this checkout (where
    ``enable_plugin`` would clone it), Nova and Tempest have configuration
    files as DevStack leaves them, and the services get free ports.
    """

    def __init__(self, enabled: str, disabled: str = "") -> None:
        super().__init__()
        self.enabled = enabled
        self.disabled = disabled

    def _setUp(self) -> None:
        self.root = self.useFixture(fixtures.TempDir()).path
        self.dest = os.path.join(self.root, "opt-stack")
        os.makedirs(self.dest)
        os.symlink(REPO, os.path.join(self.dest, "trusted-cloud"))
        self.conf_dir = os.path.join(self.root, "etc-trusted-cloud")
        self.data_dir = os.path.join(self.root, "data", "trusted-cloud")
        self.pki = os.path.join(self.conf_dir, "pki")
        self.nova_conf = os.path.join(self.root, "nova.conf")
        with open(self.nova_conf, "w") as f:
            f.write("[notifications]\nnotification_format = unversioned\n")
        self.tempest_conf = os.path.join(self.root, "tempest.conf")
        self.log = os.path.join(self.root, "calls.log")
        open(self.log, "w").close()
        self.registrar_port = free_port()
        self.verifier_port = free_port()
        self.push_port = free_port()
        self.env = dict(
            os.environ,
            DEST=self.dest,
            DATA_DIR=os.path.join(self.root, "data"),
            SERVICE_HOST="127.0.0.1",
            REGION_NAME="RegionOne",
            KEYSTONE_SERVICE_URI="https://127.0.0.1/identity",
            SERVICE_PASSWORD="service-secret",
            SERVICE_DOMAIN_NAME="Default",
            SERVICE_PROJECT_NAME="service",
            STACK_USER=getpass.getuser(),
            NOVA_CONF=self.nova_conf,
            TEMPEST_CONFIG=self.tempest_conf,
            ENABLED_SERVICES=self.enabled,
            DISABLED_SERVICES=self.disabled,
            ENABLE_DEBUG_LOG_LEVEL="True",
            SERVICE_TIMEOUT="30",
            TRUSTED_CLOUD_CONF_DIR=self.conf_dir,
            TRUSTED_REGISTRAR_PORT=str(self.registrar_port),
            TRUSTED_VERIFIER_PORT=str(self.verifier_port),
            TRUSTED_PUSH_PORT=str(self.push_port),
            FAKE_DEVSTACK_LOG=self.log,
            FAKE_DEVSTACK_DIR=self.root,
            FAKE_DEVSTACK_BIN=BIN,
            FAKE_DEVSTACK_PYTHON=sys.executable,
            FAKE_DEVSTACK_RUN="trusted-registrar,trusted-verifier",
        )
        self.env.pop("TRUSTED_CLOUD_DIR", None)
        self.addCleanup(self._kill_started)

    def _kill_started(self) -> None:
        pids = os.path.join(self.root, "pids")
        if not os.path.isdir(pids):
            return
        for name in os.listdir(pids):
            with open(os.path.join(pids, name)) as f:
                pid = int(f.read())
            try:
                os.kill(pid, 15)
            except ProcessLookupError:
                continue
            for _ in range(100):
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.1)

    def phase(self, *args: str) -> list[list[str]]:
        """Run ``plugin.sh *args``; return the calls it made, parsed."""
        with open(self.log) as f:
            seen = len(f.readlines())
        proc = subprocess.run(
            [
                "bash",
                "-c",
                _PHASE,
                os.path.join(DEVSTACK, "tests", "fake-functions.sh"),
                os.path.join(DEVSTACK, "settings"),
                os.path.join(DEVSTACK, "plugin.sh"),
                *args,
            ],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if proc.returncode != 0:
            raise AssertionError(
                f"plugin.sh {' '.join(args)} failed ({proc.returncode}):\n"
                f"{proc.stdout}\n{proc.stderr[-4000:]}"
            )
        with open(self.log) as f:
            lines = f.readlines()[seen:]
        return [shlex.split(line) for line in lines]

    def stack(self, upto: str) -> None:
        """Run the ``stack`` phases in DevStack's order, up to ``upto``."""
        for phase in ("install", "post-config", "extra", "test-config"):
            self.phase("stack", phase)
            if phase == upto:
                return

    def conf(self, name: str) -> str:
        return os.path.join(self.conf_dir, name)


def _calls(calls: list[list[str]], name: str) -> list[list[str]]:
    return [c[1:] for c in calls if c[0] == name]


def _read_ini(path: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    with open(path) as f:
        parser.read_file(f)
    return parser


SERVICES = "key,n-api,n-cpu,placement-api,tempest"
NO_KEYSTONE = "n-api,n-cpu,placement-api,tempest"


class _PluginTestCase(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.real_options = _real_options()

    def devstack(self, enabled: str = SERVICES, disabled: str = "") -> FakeDevstack:
        return self.useFixture(FakeDevstack(enabled, disabled))

    def assertRealOptions(self, path: str) -> configparser.ConfigParser:
        """Every option written in ``path`` is one the services read, and the
        file parses with oslo.config into typed values."""
        parser = _read_ini(path)
        for section in ["DEFAULT", *parser.sections()]:
            keys = (
                set(parser.defaults())
                if section == "DEFAULT"
                else set(parser[section]) - set(parser.defaults())
            )
            self.assertIn(section, self.real_options, f"{path}: [{section}]")
            unknown = keys - self.real_options[section]
            self.assertEqual(set(), unknown, f"{path}: unknown in [{section}]")
        conf = cfg.ConfigOpts()
        for group, opts in (
            verifier_opts.list_opts() + hooks_opts.list_opts() + agent_opts.list_opts()
        ):
            conf.register_opts(opts, group=group)
        oslo_log.register_options(conf)
        conf(["--config-file", path], project="trusted-cloud", default_config_files=[])
        for key in parser.defaults():  # every value converts to its type
            getattr(conf, key)
        for section in parser.sections():
            for key in set(parser[section]) - set(parser.defaults()):
                getattr(conf[section], key)
        return parser


class DevstackConfigTest(_PluginTestCase):
    """install, post-config and clean: what is installed and written."""

    def test_stack_install_develops_the_checkout(self) -> None:
        ds = self.devstack()
        calls = ds.phase("stack", "install")
        self.assertEqual(
            [[os.path.join(ds.dest, "trusted-cloud"), "server"]],
            _calls(calls, "setup_develop"),
        )
        self.assertEqual(
            [["libtss2-dev", "pkg-config"]], _calls(calls, "install_package")
        )
        self.assertEqual([], _calls(calls, "iniset"))
        self.assertFalse(os.path.exists(ds.conf_dir))

    def test_stack_install_adds_the_agent_extra_with_the_agent(self) -> None:
        ds = self.devstack(enabled=SERVICES + ",trusted-agent")
        calls = ds.phase("stack", "install")
        self.assertEqual(
            [[os.path.join(ds.dest, "trusted-cloud"), "server,agent"]],
            _calls(calls, "setup_develop"),
        )

    def test_with_horizon_the_dashboard_is_installed_and_enabled(self) -> None:
        ds = self.devstack(enabled=SERVICES + ",horizon")
        calls = ds.phase("stack", "install")
        self.assertEqual(
            [[os.path.join(ds.dest, "trusted-cloud"), "server,dashboard"]],
            _calls(calls, "setup_develop"),
        )
        horizon = os.path.join(ds.root, "horizon")
        os.makedirs(os.path.join(horizon, "openstack_dashboard", "conf"))
        ds.env["HORIZON_DIR"] = horizon
        ds.phase("stack", "post-config")
        enabled = os.path.join(horizon, "openstack_dashboard", "local", "enabled")
        import attestation_dashboard

        self.assertEqual(
            sorted(os.path.basename(p) for p in attestation_dashboard.enabled_files()),
            sorted(os.listdir(enabled)),
        )
        policy = os.path.join(
            horizon, "openstack_dashboard", "conf", "attestation_policy.yaml"
        )
        with open(policy) as f, open(attestation_dashboard.POLICY_FILE) as g:
            self.assertEqual(g.read(), f.read())

    def test_post_config_writes_registrar_and_verifier_conf(self) -> None:
        ds = self.devstack()
        ds.stack("post-config")
        registrar = self.assertRealOptions(ds.conf("registrar.conf"))["registrar"]
        self.assertEqual(str(ds.registrar_port), registrar["port"])
        self.assertEqual("127.0.0.1", registrar["host"])
        self.assertEqual(
            f"sqlite:///{ds.data_dir}/registrar.sqlite",
            registrar["database_connection"],
        )
        self.assertEqual("False", registrar["require_ek_certificate"])
        self.assertNotIn("ek_ca_bundle", registrar)
        # this devstack attests no compute host: the host gate is off
        self.assertEqual("off", registrar["host_trust"])
        verifier_conf = self.assertRealOptions(ds.conf("verifier.conf"))
        verifier = verifier_conf["verifier"]
        self.assertEqual(str(ds.verifier_port), verifier["port"])
        self.assertEqual(
            f"https://127.0.0.1:{ds.registrar_port}", verifier["registrar_url"]
        )
        self.assertEqual("inprocess", verifier["notifiers"])
        self.assertEqual(str(ds.push_port), verifier_conf["push"]["port"])
        self.assertEqual("log", verifier_conf["revocation_hooks"]["actions"])
        for section in (registrar, verifier):
            for key in ("cert_file", "key_file", "ca_file"):
                self.assertTrue(os.path.isfile(section[key]), section[key])
        self.assertTrue(os.path.isfile(os.path.join(verifier["ca_dir"], "ca-key.pem")))
        self.assertFalse(os.path.exists(ds.conf("agent.conf")))

    def test_post_config_registers_the_attestation_service_with_keystone(
        self,
    ) -> None:
        ds = self.devstack()
        ds.stack("install")
        calls = ds.phase("stack", "post-config")
        self.assertEqual([["attestation"]], _calls(calls, "create_service_user"))
        self.assertEqual(
            [["attestation", "attestation", "Trusted cloud attestation (verifier)"]],
            _calls(calls, "get_or_create_service"),
        )
        self.assertEqual(
            [["attestation", "RegionOne", f"https://127.0.0.1:{ds.verifier_port}"]],
            _calls(calls, "get_or_create_endpoint"),
        )
        self.assertEqual(
            [
                [ds.conf("registrar.conf"), "attestation"],
                [ds.conf("verifier.conf"), "attestation"],
            ],
            _calls(calls, "configure_keystone_authtoken_middleware"),
        )
        verifier = _read_ini(ds.conf("verifier.conf"))["verifier"]
        self.assertEqual("keystone", verifier["auth_strategy"])
        registrar = _read_ini(ds.conf("registrar.conf"))["registrar"]
        self.assertEqual("keystone", registrar["auth_strategy"])

    def test_post_config_keeps_the_trust_trait_in_placement(self) -> None:
        ds = self.devstack()
        ds.stack("install")
        ds.phase("stack", "post-config")
        placement = _read_ini(ds.conf("verifier.conf"))["placement"]
        self.assertEqual("True", placement["trait_sync"])
        self.assertEqual("password", placement["auth_type"])
        self.assertEqual("attestation", placement["username"])
        self.assertEqual("https://127.0.0.1/identity", placement["auth_url"])
        self.assertEqual("RegionOne", placement["region_name"])

    def test_no_trait_sync_without_placement_or_when_turned_off(self) -> None:
        for enabled, env in (
            ("key,n-api,n-cpu,tempest", {}),
            (SERVICES, {"TRUSTED_PLACEMENT_TRAITS": "False"}),
        ):
            ds = self.devstack(enabled)
            ds.env.update(env)
            ds.stack("install")
            ds.phase("stack", "post-config")
            self.assertNotIn("placement", _read_ini(ds.conf("verifier.conf")))

    def test_without_keystone_the_verifier_is_noauth(self) -> None:
        ds = self.devstack("n-api")
        ds.stack("install")
        calls = ds.phase("stack", "post-config")
        self.assertEqual([], _calls(calls, "get_or_create_service"))
        verifier = _read_ini(ds.conf("verifier.conf"))["verifier"]
        self.assertEqual("noauth", verifier["auth_strategy"])
        registrar = _read_ini(ds.conf("registrar.conf"))["registrar"]
        self.assertEqual("noauth", registrar["auth_strategy"])

    def test_post_config_creates_certificates_from_one_ca(self) -> None:
        ds = self.devstack()
        ds.stack("post-config")
        with open(os.path.join(ds.pki, "ca.pem"), "rb") as f:
            ca = x509.load_pem_x509_certificate(f.read())
        for name in ("registrar", "verifier", "tenant", "agent", "admin"):
            with open(os.path.join(ds.pki, f"{name}.pem"), "rb") as f:
                cert = x509.load_pem_x509_certificate(f.read())
            cert.verify_directly_issued_by(ca)  # raises if not
            cn = cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
            self.assertEqual(name, cn[0].value)  # the role the services grant
            self.assertTrue(os.path.isfile(os.path.join(ds.pki, f"{name}-key.pem")))

    def test_post_config_generates_the_sample_config(self) -> None:
        ds = self.devstack()
        ds.stack("post-config")
        with open(ds.conf("trusted-cloud.conf.sample")) as f:
            sample = f.read()
        for group in ("[registrar]", "[verifier]", "[agent]", "[revocation_hooks]"):
            self.assertIn(group, sample)

    def test_post_config_turns_on_nova_versioned_notifications(self) -> None:
        ds = self.devstack()
        ds.stack("post-config")
        nova = _read_ini(ds.nova_conf)
        self.assertEqual("versioned", nova["notifications"]["notification_format"])
        self.assertEqual("messagingv2", nova["oslo_messaging_notifications"]["driver"])

    def test_nova_conf_untouched_without_nova(self) -> None:
        ds = self.devstack(enabled="key")
        ds.stack("post-config")
        nova = _read_ini(ds.nova_conf)
        self.assertEqual("unversioned", nova["notifications"]["notification_format"])
        self.assertFalse(nova.has_section("oslo_messaging_notifications"))

    def test_clean_removes_configuration_and_data(self) -> None:
        ds = self.devstack()
        ds.stack("post-config")
        self.assertTrue(os.path.isdir(ds.data_dir))
        calls = ds.phase("clean")
        self.assertIn(["rm", "-rf", ds.conf_dir, ds.data_dir], _calls(calls, "sudo"))
        self.assertFalse(os.path.exists(ds.conf_dir))
        self.assertFalse(os.path.exists(ds.data_dir))

    def test_disabled_services_are_left_alone(self) -> None:
        ds = self.devstack(disabled="trusted-registrar,trusted-verifier")
        for args in (
            ("stack", "install"),
            ("stack", "post-config"),
            ("stack", "extra"),
            ("stack", "test-config"),
            ("unstack",),
            ("clean",),
        ):
            calls = [c for c in ds.phase(*args) if c[0] != "enable_service"]
            self.assertEqual([], calls, args)
        self.assertFalse(os.path.exists(ds.conf_dir))

    def test_only_the_verifier(self) -> None:
        ds = self.devstack(disabled="trusted-registrar")
        ds.stack("post-config")
        self.assertFalse(os.path.exists(ds.conf("registrar.conf")))
        self.assertRealOptions(ds.conf("verifier.conf"))


class DevstackServicesTest(_PluginTestCase):
    """extra, test-config and unstack: the services really run."""

    def test_extra_starts_the_services_and_unstack_stops_them(self) -> None:
        # no Keystone here: the verifier takes the tenant certificate (noauth)
        ds = self.devstack(NO_KEYSTONE)
        ds.stack("post-config")
        calls = ds.phase("stack", "extra")
        self.assertEqual(
            [
                [
                    "trusted-registrar",
                    f"{BIN}/trusted-registrar --config-file "
                    f"{ds.conf('registrar.conf')}",
                ],
                [
                    "trusted-verifier",
                    f"{BIN}/trusted-verifier --config-file {ds.conf('verifier.conf')}",
                ],
            ],
            _calls(calls, "run_process"),
        )
        # The services really run from what post-config wrote: the verifier
        # answers the tenant over mTLS, and a client without a cert only 401.
        self.assertTrue(_listening(ds.registrar_port))
        url = f"https://127.0.0.1:{ds.verifier_port}/v1/nodes"
        ca = os.path.join(ds.pki, "ca.pem")
        tenant = (
            os.path.join(ds.pki, "tenant.pem"),
            os.path.join(ds.pki, "tenant-key.pem"),
        )
        self.assertEqual(
            200, requests.get(url, cert=tenant, verify=ca, timeout=10).status_code
        )
        # the push endpoint the plugin configured serves agents (no client
        # certificate: they authenticate with their TPM)
        self.assertTrue(_listening(ds.push_port))
        # a client without a certificate connects (load balancers'
        # healthcheck) and is served nothing else
        self.assertEqual(401, requests.get(url, verify=ca, timeout=10).status_code)
        health = url.replace("/v1/nodes", "/healthcheck")
        self.assertEqual(200, requests.get(health, verify=ca, timeout=10).status_code)

        calls = ds.phase("unstack")
        self.assertEqual(
            [["trusted-verifier"], ["trusted-registrar"]], _calls(calls, "stop_process")
        )
        self.assertFalse(_listening(ds.registrar_port))
        self.assertFalse(_listening(ds.verifier_port))
        self.assertFalse(_listening(ds.push_port))

    def test_shipped_systemd_units_run_the_services(self) -> None:
        # TRUSTED_SYSTEMD_UNITS=True: the shipped units (etc/systemd) with a
        # drop-in, enabled and started with systemctl instead of run_process
        ds = self.devstack(NO_KEYSTONE)
        units = os.path.join(ds.root, "systemd")
        os.makedirs(units)
        ds.env.update(TRUSTED_SYSTEMD_UNITS="True", TRUSTED_SYSTEMD_DIR=units)
        ds.stack("post-config")
        calls = ds.phase("stack", "extra")
        self.assertEqual([], _calls(calls, "run_process"))
        self.assertEqual(
            [
                ["daemon-reload"],
                ["enable", "--now", "trusted-registrar.service"],
                ["daemon-reload"],
                ["enable", "--now", "trusted-verifier.service"],
            ],
            _calls(calls, "systemctl"),
        )
        for service in ("trusted-registrar", "trusted-verifier"):
            unit = os.path.join(units, f"{service}.service")
            with (
                open(unit) as f,
                open(os.path.join(SYSTEMD, f"{service}.service")) as g,
            ):
                self.assertEqual(g.read(), f.read())  # the shipped unit, as is
            with open(os.path.join(f"{unit}.d", "devstack.conf")) as f:
                dropin = f.read()
            conf = ds.conf(service.replace("trusted-", "") + ".conf")
            self.assertIn(
                f"ExecStart=\nExecStart={BIN}/{service} --config-file {conf}\n",
                dropin,
            )
            self.assertIn(f"User={getpass.getuser()}\n", dropin)
            # the real systemd-analyze takes the unit and its drop-in
            verify = subprocess.run(
                ["systemd-analyze", "verify", "--man=no", unit],
                capture_output=True,
                text=True,
                timeout=60,
            )
            self.assertEqual(
                (0, ""), (verify.returncode, verify.stdout + verify.stderr), unit
            )
        # the unit's command line (the drop-in's) is what runs: the verifier
        # answers the tenant over mTLS
        url = f"https://127.0.0.1:{ds.verifier_port}/v1/nodes"
        tenant = (
            os.path.join(ds.pki, "tenant.pem"),
            os.path.join(ds.pki, "tenant-key.pem"),
        )
        ca = os.path.join(ds.pki, "ca.pem")
        self.assertEqual(
            200, requests.get(url, cert=tenant, verify=ca, timeout=10).status_code
        )

        calls = ds.phase("unstack")
        self.assertEqual(
            [
                ["stop", "trusted-verifier.service"],
                ["stop", "trusted-registrar.service"],
            ],
            _calls(calls, "systemctl"),
        )
        self.assertFalse(_listening(ds.verifier_port))
        calls = ds.phase("clean")
        self.assertIn(
            ["disable", "trusted-verifier.service"], _calls(calls, "systemctl")
        )
        self.assertEqual([], os.listdir(units))

    def test_test_config_gives_the_tenant_cli_its_environment(self) -> None:
        # no Keystone here: the verifier takes the tenant certificate (noauth)
        ds = self.devstack(NO_KEYSTONE)
        ds.stack("test-config")
        tempest = _read_ini(ds.tempest_conf)
        self.assertEqual("True", tempest["service_available"]["trusted_cloud"])
        out = subprocess.run(
            [
                "bash",
                "-c",
                f'source "$0" && "{BIN}/trusted-tenant" list',
                ds.conf("tenantrc"),
            ],
            env=ds.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        self.assertEqual(0, out.returncode, out.stderr)
        ds.phase("unstack")

    def test_agent_is_optional_and_keeps_its_uuid(self) -> None:
        ds = self.devstack(enabled=SERVICES + ",trusted-agent")
        ds.stack("post-config")
        agent = self.assertRealOptions(ds.conf("agent.conf"))["agent"]
        uuid = agent["uuid"]
        self.assertEqual(36, len(uuid))
        self.assertEqual(
            f"https://127.0.0.1:{ds.registrar_port}", agent["registrar_url"]
        )
        self.assertEqual("device:/dev/tpmrm0", agent["tcti"])
        # where it pushes if switched to push mode: the verifier's push port
        self.assertEqual(f"https://127.0.0.1:{ds.push_port}", agent["push_url"])
        ds.phase("stack", "post-config")  # configured again: same node
        self.assertEqual(uuid, _read_ini(ds.conf("agent.conf"))["agent"]["uuid"])
        calls = ds.phase("stack", "extra")
        self.assertIn(
            [
                "trusted-agent",
                f"{BIN}/trusted-agent --config-file {ds.conf('agent.conf')}",
            ],
            _calls(calls, "run_process"),
        )
        calls = ds.phase("unstack")
        self.assertEqual(
            [["trusted-agent"], ["trusted-verifier"], ["trusted-registrar"]],
            _calls(calls, "stop_process"),
        )


class ShellcheckTest(testtools.TestCase):
    def test_plugin_is_shellcheck_clean(self) -> None:
        shellcheck = shutil.which("shellcheck")
        if shellcheck is None:
            self.fail(
                "shellcheck is not installed: run tools/install-deps.sh "
                "(or apt-get install shellcheck)"
            )
        files = [
            os.path.join(DEVSTACK, name)
            for name in (
                "plugin.sh",
                "settings",
                os.path.join("tests", "fake-functions.sh"),
            )
        ]
        proc = subprocess.run(
            [shellcheck, "--shell=bash", *files],
            capture_output=True,
            text=True,
            timeout=60,
        )
        self.assertEqual(0, proc.returncode, proc.stdout + proc.stderr)
