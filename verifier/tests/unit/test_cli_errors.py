"""Command-line and configuration errors (issue 18): one line naming the
option, file or position, exit status 2, never a traceback -- a test per
command."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable

import testtools

from ipsec_puppet_vault_hooks import autosign
from ipsec_puppet_vault_hooks.cmd import listener as hooks_listener
from node_agent import cmd as agent_cmd
from nova_plugin import cmd as tenant_cmd
from nova_plugin import nova_cmd
from verifier.cmd import certs, ima_policy, keyservice, nova_listener, registrar
from verifier.cmd import verifier as verifier_cmd
from verifier.common.tls import self_signed_certificate
from vtpm_manager import cmd as vtpm_cmd

UUID = "3f2a6c1e-5b1d-4c1e-9a7e-0c6d2b8e4f10"


class CliErrorsTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.tmp = tmp.name
        self.missing = os.path.join(self.tmp, "missing.conf")

    def write(self, name: str, text: str) -> str:
        path = os.path.join(self.tmp, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return path

    def run_main(self, main: Callable[[list[str]], int], argv: list[str]) -> str:
        """Run ``main(argv)`` in this process; assert exit status 2 and one
        line on stderr without a traceback; return the line."""
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                status = main(argv)
            except SystemExit as exc:
                status = exc.code  # type: ignore[assignment]
        text = err.getvalue()
        self.assertEqual(2, status, text)
        self.assertNotIn("Traceback", text)
        lines = text.strip().splitlines()
        self.assertEqual(1, len(lines), text)
        return lines[0]

    def assert_missing_file(self, main: Callable[[list[str]], int]) -> None:
        line = self.run_main(main, ["--config-file", self.missing])
        self.assertIn(f"cannot read configuration file(s): {self.missing}", line)

    def test_registrar_missing_config_file_exits_2(self) -> None:
        self.assert_missing_file(registrar.main)

    def test_verifier_missing_config_file_exits_2(self) -> None:
        self.assert_missing_file(verifier_cmd.main)

    def test_keyservice_missing_config_file_exits_2(self) -> None:
        self.assert_missing_file(keyservice.main)

    def test_agent_missing_config_file_exits_2(self) -> None:
        self.assert_missing_file(agent_cmd.main)

    def test_revocation_listener_missing_config_file_exits_2(self) -> None:
        self.assert_missing_file(hooks_listener.main)

    def test_nova_listener_missing_config_file_exits_2(self) -> None:
        self.assert_missing_file(nova_listener.main)

    def test_vtpm_manager_missing_config_file_exits_2(self) -> None:
        line = self.run_main(
            vtpm_cmd.main,
            ["--config-file", self.missing, "forget", "--instance-uuid", UUID],
        )
        self.assertIn(self.missing, line)

    def test_verifier_inline_comment_in_a_float_option_exits_2(self) -> None:
        conf = self.write("v.conf", "[verifier]\nquote_interval = 2.0  # seconds\n")
        line = self.run_main(verifier_cmd.main, ["--config-file", conf])
        self.assertIn(f"[verifier] quote_interval in {conf}", line)
        self.assertIn("could not convert string to float: '2.0  # seconds'", line)

    def test_config_file_syntax_error_names_the_file(self) -> None:
        conf = self.write("r.conf", "[registrar\nhost = x\n")
        line = self.run_main(registrar.main, ["--config-file", conf])
        self.assertIn(conf, line)

    def test_registrar_missing_certificate_names_the_option_and_path(self) -> None:
        # a real process: the service sets up logging before it starts
        cert = os.path.join(self.tmp, "nope", "registrar.pem")
        conf = self.write(
            "reg.conf",
            f"[registrar]\ncert_file = {cert}\nkey_file = {cert}\n"
            f"ca_file = {cert}\ndatabase_connection = sqlite:///"
            f"{os.path.join(self.tmp, 'r.db')}\n",
        )
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from verifier.cmd.registrar import main; sys.exit(main())",
                "--config-file",
                conf,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        self.assertEqual(2, proc.returncode, proc.stderr)
        self.assertNotIn("Traceback", proc.stderr)
        self.assertIn(
            f"configuration error: [registrar] cert_file {cert}: "
            "No such file or directory",
            proc.stderr,
        )

    # -- trusted-tenant ---------------------------------------------------

    def _tenant_env(self) -> dict[str, str]:
        key, cert = self_signed_certificate("tenant", [])
        cert_file = self.write("tenant.pem", cert.decode())
        key_file = self.write("tenant-key.pem", key.decode())
        return {
            "TRUSTED_REGISTRAR_URL": "https://127.0.0.1:9",
            "TRUSTED_VERIFIER_URL": "https://127.0.0.1:9",
            "TRUSTED_CERT": cert_file,
            "TRUSTED_KEY": key_file,
            "TRUSTED_CA": cert_file,
        }

    def _tenant(self, argv: list[str], **env: str) -> str:
        values = self._tenant_env() | env
        for key, value in values.items():
            self.useFixture(_Env(key, value))
        return self.run_main(tenant_cmd.main, argv)

    def test_tenant_policy_file_with_a_json_error_names_the_position(self) -> None:
        policy = self.write("p.json", '{"pcrs": {"16": ["00"],}}')
        payload = self.write("payload", "hello")
        line = self._tenant(["enrol", UUID, "--payload", payload, "--policy", policy])
        self.assertIn(f"--policy {policy}: not valid JSON", line)
        self.assertIn("line 1 column", line)

    def test_tenant_missing_certificate_names_the_option_and_path(self) -> None:
        payload = self.write("payload", "hello")
        cert = os.path.join(self.tmp, "nope.pem")
        line = self._tenant(
            ["enrol", UUID, "--payload", payload, "--pcr", "16=00"],
            TRUSTED_CERT=cert,
        )
        self.assertIn(f"--cert (or $TRUSTED_CERT) {cert}: No such file", line)

    def test_tenant_certificate_that_is_not_pem_names_the_options(self) -> None:
        payload = self.write("payload", "hello")
        junk = self.write("junk.pem", "not a certificate")
        line = self._tenant(
            ["enrol", UUID, "--payload", payload, "--pcr", "16=00"],
            TRUSTED_CERT=junk,
        )
        self.assertIn(f"--cert {junk}", line)

    def test_tenant_without_keystone_needs_the_certificate(self) -> None:
        # the noauth demo: the certificate names the tenant's project
        payload = self.write("payload", "hello")
        line = self._tenant(
            ["enrol", UUID, "--payload", payload, "--pcr", "16=00"],
            TRUSTED_CERT="",
            TRUSTED_KEY="",
        )
        self.assertIn(
            "missing settings: --cert (or $TRUSTED_CERT), --key (or $TRUSTED_KEY)",
            line,
        )

    def test_tenant_on_keystone_needs_no_certificate(self) -> None:
        # keystoneauth options: no certificate is asked for; the run gets
        # as far as the (bad) policy file, before any network call
        payload = self.write("payload", "hello")
        policy = self.write("p.json", '{"pcrs": ')
        keystone = [
            "--os-auth-type", "password", "--os-auth-url", "http://127.0.0.1:9/v3",
            "--os-username", "alice", "--os-password", "secret",
            "--os-project-name", "alpha",
        ]  # fmt: skip
        line = self._tenant(
            [*keystone, "enrol", UUID, "--payload", payload, "--policy", policy],
            TRUSTED_CERT="",
            TRUSTED_KEY="",
            TRUSTED_VERIFIER_URL="",
        )
        self.assertIn(f"--policy {policy}: not valid JSON", line)

    def test_tenant_policy_add_with_deep_json_exits_2(self) -> None:
        policy = self.write("deep.json", "[" * 100_000 + "]" * 100_000)
        line = self._tenant(["policy", "add", policy])
        self.assertIn("nested more than", line)

    def test_tenant_enrol_policy_file_missing_names_the_option_and_path(self) -> None:
        payload = self.write("payload", "hello")
        policy = os.path.join(self.tmp, "nope.json")
        line = self._tenant(["enrol", UUID, "--payload", payload, "--policy", policy])
        self.assertIn(f"--policy {policy}: No such file or directory", line)

    # -- trusted-nova -----------------------------------------------------

    def _nova_boot(self, *extra: str) -> str:
        env = self._tenant_env()
        payload = self.write("payload", "hello")
        argv = [
            "boot", "vm", "--flavor", "1", "--image", "img", "--payload", payload,
            "--registrar", env["TRUSTED_REGISTRAR_URL"],
            "--verifier", env["TRUSTED_VERIFIER_URL"],
            "--cert", env["TRUSTED_CERT"], "--key", env["TRUSTED_KEY"],
            "--ca", env["TRUSTED_CA"],
            "--os-auth-type", "none", "--os-endpoint", "http://127.0.0.1:9/v2.1",
            *extra,
        ]  # fmt: skip
        return self.run_main(nova_cmd.main, argv)

    def test_nova_boot_trust_policy_json_error_names_the_position(self) -> None:
        policy = self.write("p.json", '{"pcrs": {"16": ["00"],}}')
        line = self._nova_boot("--trust-policy", policy)
        self.assertIn(f"--trust-policy {policy}: ", line)
        self.assertIn("line 1 column", line)

    def test_nova_boot_bad_pcr_argument_names_the_option(self) -> None:
        line = self._nova_boot("--pcr", "16")
        self.assertIn("--pcr '16': expected N=HEX", line)

    def test_nova_boot_missing_ca_names_the_option_and_path(self) -> None:
        ca = os.path.join(self.tmp, "nope-ca.pem")
        line = self._nova_boot("--pcr", "16=" + "00" * 32, "--ca", ca)
        self.assertIn(f"--ca (or $TRUSTED_CA) {ca}: No such file or directory", line)

    # -- trusted-certs ----------------------------------------------------

    def test_certs_unwritable_directory_names_the_option_and_path(self) -> None:
        blocker = self.write("a-file", "not a directory")
        target = os.path.join(blocker, "pki")
        line = self.run_main(certs.main, ["--dir", target, "verifier"])
        self.assertIn(f"--dir {target}: ", line)

    def test_certs_broken_ca_key_names_the_directory(self) -> None:
        pki = os.path.join(self.tmp, "pki")
        os.makedirs(pki)
        self.write("pki/ca-key.pem", "not a key")
        self.write("pki/ca.pem", "not a certificate")
        line = self.run_main(certs.main, ["--dir", pki, "verifier"])
        self.assertIn(f"cannot load the CA from {pki}", line)

    def test_certs_name_with_a_path_separator_is_refused(self) -> None:
        pki = os.path.join(self.tmp, "pki")
        line = self.run_main(certs.main, ["--dir", pki, "../escape"])
        self.assertIn("certificate name '../escape'", line)

    # -- trusted-ima-policy -----------------------------------------------

    def test_ima_policy_check_json_error_names_the_file_and_position(self) -> None:
        policy = self.write("rt.json", '{"name": "x",\n "version": }')
        log = self.write("ascii", "")
        line = self.run_main(ima_policy.main, ["check", policy, log])
        self.assertIn(f"{policy}: malformed runtime policy", line)
        self.assertIn("line 2 column", line)

    def test_ima_policy_check_json_array_names_the_file(self) -> None:
        policy = self.write("rt.json", "[1, 2]")
        log = self.write("ascii", "")
        line = self.run_main(ima_policy.main, ["check", policy, log])
        self.assertIn(f"{policy}: ", line)

    def test_ima_policy_missing_log_names_the_path(self) -> None:
        log = os.path.join(self.tmp, "nope")
        line = self.run_main(
            ima_policy.main,
            ["from-log", log, "--name", "p", "--version", "1", "-o", "out.json"],
        )
        self.assertIn(f"{log}: No such file or directory", line)

    def test_ima_policy_malformed_log_names_the_file(self) -> None:
        log = self.write("ascii", "10 zz ima-ng sha256:00 /bin/\u00e9\n")
        line = self.run_main(
            ima_policy.main,
            ["from-log", log, "--name", "p", "--version", "1", "-o", "out.json"],
        )
        self.assertIn(f"{log}: ", line)

    # -- trusted-puppet-autosign ------------------------------------------

    def test_autosign_missing_config_file_exits_2(self) -> None:
        line = self.run_main(
            autosign.main, ["--config-file", self.missing, "node.example"]
        )
        self.assertIn(f"cannot read configuration file(s): {self.missing}", line)

    def test_autosign_inline_comment_in_a_float_option_exits_2(self) -> None:
        conf = self.write("a.conf", "[puppet_autosign]\ntimeout = 5.0  # seconds\n")
        line = self.run_main(autosign.main, ["--config-file", conf, "node.example"])
        self.assertIn(f"[puppet_autosign] timeout in {conf}", line)


class _Env:
    """Sets one environment variable for a test (a fixtures-like object)."""

    def __init__(self, key: str, value: str) -> None:
        self.key, self.value = key, value

    def setUp(self) -> None:
        self.old = os.environ.get(self.key)
        os.environ[self.key] = self.value

    def cleanUp(self) -> None:
        if self.old is None:
            os.environ.pop(self.key, None)
        else:
            os.environ[self.key] = self.old

    def getDetails(self) -> dict[str, object]:
        return {}
