"""``trusted-vtpm-manager`` in-process: results and one-line errors."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import tempfile

import libvirt
import testtools

from trusted_testing.registrar import ThreadRegistrar
from verifier.common.swtpm_localca import ek_ca_bundle
from verifier.exceptions import NotFoundError
from vtpm_manager import cmd
from vtpm_manager.swtpm_state import create_state
from vtpm_manager.tests.unit.test_domain_xml import TPM12, _domain


class CliTest(testtools.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.server = ThreadRegistrar()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.server.close()
        super().tearDownClass()

    def setUp(self) -> None:
        super().setUp()
        tmp = tempfile.mkdtemp(prefix="vtpm-cli-")
        self.addCleanup(shutil.rmtree, tmp, True)
        self.conf = os.path.join(tmp, "vtpm.conf")
        with open(self.conf, "w") as f:
            f.write(
                "[vtpm_manager]\nlibvirt_uri = test:///default\n"
                f"swtpm_storage_dir = {tmp}/swtpm\nlocalca_dir = {tmp}/ca\n"
                f"registrar_url = {self.server.url}\nregistrar_retries = 0\n"
            )
        self.conn = libvirt.open("test:///default")
        self.addCleanup(self.conn.close)

    def run_cli(self, *argv: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cmd.main(["--config-file", self.conf, *argv])
        return code, out.getvalue(), err.getvalue()

    def test_ensure_prints_the_result(self) -> None:
        dom = self.conn.defineXML(_domain())
        self.addCleanup(dom.undefine)
        code, out, err = self.run_cli("--json", "ensure", dom.name())
        self.assertEqual(0, code, err)
        result = json.loads(out)
        self.assertEqual(dom.UUIDString(), result["instance_uuid"])
        self.assertTrue(result["device_added"] and result["newly_registered"])

    def test_unknown_domain_is_one_clear_line(self) -> None:
        code, out, err = self.run_cli("ensure", "no-such-domain")
        self.assertEqual(2, code)
        self.assertEqual(
            "trusted-vtpm-manager: error: no libvirt domain named or with UUID "
            "'no-such-domain'\n",
            err,
        )

    def test_tpm12_domain_is_one_clear_line(self) -> None:
        dom = self.conn.defineXML(_domain(TPM12))
        self.addCleanup(dom.undefine)
        code, _, err = self.run_cli("ensure", dom.name())
        self.assertEqual(2, code)
        self.assertIn("supports TPM 2.0 only", err)
        self.assertNotIn("Traceback", err)

    def test_bad_instance_uuid_and_missing_tls_options(self) -> None:
        dom = self.conn.defineXML(_domain())
        self.addCleanup(dom.undefine)
        code, _, err = self.run_cli("ensure", dom.name(), "--instance-uuid", "x")
        self.assertEqual(2, code)
        self.assertIn("not a UUID: 'x'", err)
        with open(self.conf, "a") as f:
            f.write("registrar_url = https://127.0.0.1:1\n")
        code, _, err = self.run_cli("ensure", dom.name())
        self.assertEqual(2, code)
        self.assertIn("cert_file, key_file and ca_file are needed", err)


class EnrolHostCliTest(testtools.TestCase):
    """``enrol-host``: the CA swtpm_localca signs vTPM EKs with, at the
    registrar under the host's Nova name."""

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        if not (shutil.which("swtpm_setup") and shutil.which("swtpm_localca")):
            # make deps installs swtpm-tools: a machine without them fails
            # here rather than skip the class unseen
            raise AssertionError("swtpm_setup/swtpm_localca missing (swtpm-tools)")
        cls.server = ThreadRegistrar()
        cls.tmp = tempfile.mkdtemp(prefix="vtpm-enrol-")
        # the first vTPM set up on a host makes its local CA
        cls.localca = os.path.join(cls.tmp, "localca")
        uuid = "6e1c2f4a-0d0b-4b8e-9a52-4f3b1b2f3c11"
        create_state(
            os.path.join(cls.tmp, "swtpm", uuid, "tpm2"),
            cls.localca,
            f"instance-00000001:{uuid}",
        )

    @classmethod
    def tearDownClass(cls) -> None:
        cls.server.close()
        shutil.rmtree(cls.tmp, True)
        super().tearDownClass()

    def run_cli(self, *argv: str) -> tuple[int, str, str]:
        conf = os.path.join(self.tmp, "vtpm.conf")
        with open(conf, "w") as f:
            f.write(
                f"[vtpm_manager]\nregistrar_url = {self.server.url}\n"
                f"registrar_retries = 0\nhost = compute-default\n"
                f"localca_conf = {self.localca}/swtpm-localca.conf\n"
            )
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cmd.main(["--config-file", conf, *argv])
        return code, out.getvalue(), err.getvalue()

    def test_enrol_reads_the_localca_config_and_replaces(self) -> None:
        code, out, err = self.run_cli("--json", "enrol-host")
        self.assertEqual(0, code, err)
        self.assertEqual(
            {"host": "compute-default", "enrolled": True, "created": True},
            {k: v for k, v in json.loads(out).items() if k != "ca_from"},
        )
        stored = self.server.registrar.hosts.get_host_ca("compute-default")
        self.assertEqual(ek_ca_bundle(self.localca).decode(), stored.ca_pem)
        code, out, _ = self.run_cli("enrol-host", "--host", "compute-default")
        self.assertEqual((0, True), (code, "created=False" in out))
        code, out, _ = self.run_cli("unenrol-host")
        self.assertEqual((0, "host=compute-default was_enrolled=True\n"), (code, out))
        code, out, _ = self.run_cli("unenrol-host")
        self.assertIn("was_enrolled=False", out)

    def test_bad_input_is_one_line_and_exit_2(self) -> None:
        leaf = os.path.join(self.tmp, "leaf.pem")
        with open(leaf, "w") as f:
            f.write(
                "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n"
            )
        empty = os.path.join(self.tmp, "empty.conf")
        with open(empty, "w") as f:
            f.write("statedir = /nonexistent\nissuercert = /nonexistent/i.pem\n")
        for argv, text in (
            (["enrol-host", "--host", "a b"], "bad host name 'a b'"),
            (["enrol-host", "--localca-conf", "/nonexistent.conf"], "cannot read"),
            (["enrol-host", "--localca-conf", empty], "does not exist: swtpm_localca"),
            (["enrol-host", "--ca-file", leaf], "not PEM certificates"),
        ):
            code, out, err = self.run_cli(*argv)
            self.assertEqual(2, code, err)
            self.assertEqual(1, err.count("\n"), err)
            self.assertTrue(err.startswith("trusted-vtpm-manager: error: "), err)
            self.assertIn(text, err)
            self.assertEqual("", out)
        with self.assertRaises(NotFoundError):
            self.server.registrar.hosts.get_host_ca("compute-default")
