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
from vtpm_manager import cmd
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
        self.assertEqual(1, code)
        self.assertEqual(
            "trusted-vtpm-manager: error: no libvirt domain named or with UUID "
            "'no-such-domain'\n",
            err,
        )

    def test_tpm12_domain_is_one_clear_line(self) -> None:
        dom = self.conn.defineXML(_domain(TPM12))
        self.addCleanup(dom.undefine)
        code, _, err = self.run_cli("ensure", dom.name())
        self.assertEqual(1, code)
        self.assertIn("supports TPM 2.0 only", err)
        self.assertNotIn("Traceback", err)

    def test_bad_instance_uuid_and_missing_tls_options(self) -> None:
        dom = self.conn.defineXML(_domain())
        self.addCleanup(dom.undefine)
        code, _, err = self.run_cli("ensure", dom.name(), "--instance-uuid", "x")
        self.assertEqual(1, code)
        self.assertIn("not a UUID: 'x'", err)
        with open(self.conf, "a") as f:
            f.write("registrar_url = https://127.0.0.1:1\n")
        code, _, err = self.run_cli("ensure", dom.name())
        self.assertEqual(1, code)
        self.assertIn("cert_file, key_file and ca_file are needed", err)
