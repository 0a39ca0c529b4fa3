"""Companion vTPMs on real libvirt (embedded qemu driver, TCG, swtpm) with
the real registrar (LocalCluster) checking EK certificates against the
compute host's local CA."""

from __future__ import annotations

import base64
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid as uuid_mod

import libvirt
import testtools

from trusted_testing.cluster import LocalCluster
from trusted_testing.embedded_libvirt import (
    EmbeddedLibvirt,
    domain_xml,
    guest_image,
    wait_for,
)
from trusted_testing.swtpm import Swtpm, ek_ca_bundle, free_port_pair
from verifier.ca import CertificateAuthority
from verifier.common import tls as tlsutil
from verifier.common.tpm import Tpm
from vtpm_manager import swtpm_state
from vtpm_manager.exceptions import EkConflictError, RegistrationRefusedError
from vtpm_manager.manager import ManagerConfig, VtpmManager
from vtpm_manager.registrar_client import ProviderRegistrarClient

TPM2_CRB = "<tpm model='tpm-crb'><backend type='emulator' version='2.0'/></tpm>"


class VtpmLibvirtTest(testtools.TestCase):
    """One embedded libvirt and one registrar for the whole class (libvirt
    allows one embedded root per process); one VM at a time."""

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.tmp = tempfile.mkdtemp(prefix="vtpm-func-")
        cls.lv: EmbeddedLibvirt | None = None
        cls.cluster: LocalCluster | None = None
        try:
            cls._start()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def _start(cls) -> None:
        cls.localca = os.path.join(cls.tmp, "localca")
        # The first swtpm_setup creates the host's local CA.
        swtpm_state.create_state(
            os.path.join(cls.tmp, "bootstrap", "tpm2"), cls.localca, "bootstrap"
        )
        bundle = os.path.join(cls.tmp, "vtpm-ek-ca.pem")
        with open(bundle, "wb") as f:
            f.write(ek_ca_bundle(cls.localca))
        cls.cluster = LocalCluster(
            os.path.join(cls.tmp, "cluster"),
            nodes=0,
            registrar_options={"ek_ca_bundle": bundle, "require_ek_certificate": True},
        )
        cls.cluster.start_services()
        pki = cls.cluster.pki
        CertificateAuthority.load(pki).issue_to_files(
            pki, "vtpm-manager", ["127.0.0.1", "localhost"]
        )
        cls.client = ProviderRegistrarClient(
            cls.cluster.registrar_url,
            tlsutil.client_context(
                os.path.join(pki, "vtpm-manager.pem"),
                os.path.join(pki, "vtpm-manager-key.pem"),
                os.path.join(pki, "ca.pem"),
            ),
            retries=1,
            backoff=0.2,
        )
        cls.lv = EmbeddedLibvirt()
        cls.config = ManagerConfig(cls.lv.swtpm_storage_dir, cls.localca)
        cls.manager = VtpmManager(
            cls.lv.conn, cls.client, cls.config, cls.lv.secret_conn
        )

    @classmethod
    def tearDownClass(cls) -> None:
        if cls.lv is not None:
            cls.lv.close()
        if cls.cluster is not None:
            cls.cluster.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)
        super().tearDownClass()

    # -- helpers ------------------------------------------------------------

    def define(self, tpm: str = "", boot: bool = False) -> libvirt.virDomain:
        assert self.lv is not None
        uuid = str(uuid_mod.uuid4())
        name = f"vtpm-func-{uuid[:8]}"
        self.serial = os.path.join(self.tmp, f"{name}.serial.log")
        image = guest_image() if boot else None
        dom = self.lv.conn.defineXML(
            domain_xml(name, uuid, self.serial, image, tpm=tpm)
        )
        self.addCleanup(self._drop, dom)
        return dom

    @staticmethod
    def _drop(dom: libvirt.virDomain) -> None:
        try:
            if dom.isActive():
                dom.destroy()
            dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_TPM)
        except libvirt.libvirtError:
            pass

    def swtpm_serving(self, state_dir: str) -> list[int]:
        assert self.lv is not None
        pids = []
        for pid in self.lv.swtpm_pids():
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f"dir={state_dir}".encode() in f.read():
                    pids.append(pid)
        return pids

    def registered(self, instance: str) -> swtpm_state.EkIdentity | None:
        return self.client.get_ek(instance)

    # -- tests --------------------------------------------------------------

    def test_ensure_then_start_runs_swtpm_on_the_registered_state(self) -> None:
        dom = self.define()
        result = self.manager.ensure(dom.name())
        self.assertTrue(result.device_added and result.state_created)
        self.assertEqual(
            os.path.join(self.lv.swtpm_storage_dir, dom.UUIDString(), "tpm2"),  # type: ignore[union-attr]
            result.state_dir,
        )
        ek = swtpm_state.read_ek(result.state_dir)
        self.assertEqual(ek, self.registered(result.instance_uuid))
        self.assertIsNotNone(ek.ek_certificate)
        dom.create()
        self.assertEqual(1, len(self.swtpm_serving(result.state_dir)))
        # libvirt used the pre-made state rather than manufacturing another.
        self.assertEqual(ek, swtpm_state.read_ek(result.state_dir))
        dom.destroy()
        self.assertTrue(wait_for(lambda: not self.swtpm_serving(result.state_dir), 10))
        self.assertTrue(self.manager.undefine(dom.name()))
        self.assertIsNone(self.registered(result.instance_uuid))
        self.assertFalse(os.path.exists(result.state_dir))

    def test_running_domain_gets_its_vtpm_at_next_cold_boot(self) -> None:
        dom = self.define()
        dom.create()
        result = self.manager.ensure(dom.name(), model="tpm-tis")
        self.assertTrue(result.pending_cold_boot)
        self.assertEqual([], self.swtpm_serving(result.state_dir))
        dom.destroy()
        dom.create()
        self.assertEqual(1, len(self.swtpm_serving(result.state_dir)))
        self.assertIn("tpm-tis", dom.XMLDesc(0))

    def test_encrypted_vtpm_state_uses_novas_secret(self) -> None:
        assert self.lv is not None
        secret_uuid = str(uuid_mod.uuid4())
        secret = self.lv.secret_conn.secretDefineXML(
            f"<secret ephemeral='no' private='no'><uuid>{secret_uuid}</uuid>"
            "<usage type='vtpm'><name>vtpm-func</name></usage></secret>"
        )
        # Not undefined afterwards: virSecretUndefine crashes libvirt 9.0's
        # embedded secret driver; the secret goes with the temporary root.
        secret.setValue(os.urandom(32))
        dom = self.define()
        result = self.manager.ensure(dom.name(), secret_uuid=secret_uuid)
        self.assertIn(f"secret='{secret_uuid}'", dom.XMLDesc(0))
        self.assertRaises(
            swtpm_state.SwtpmSetupError, swtpm_state.read_ek, result.state_dir
        )
        ek = swtpm_state.read_ek(result.state_dir, secret=bytes(secret.value()))
        self.assertEqual(ek, self.registered(result.instance_uuid))
        # Starting it is left out: libvirt 9.0's embedded driver cannot read a
        # secret on a domain start ("No current identity to elevate"); the
        # system daemon can, and passes the same passphrase to swtpm.

    def test_hook_provisions_the_vtpm_before_the_first_start(self) -> None:
        dom = self.define(TPM2_CRB)
        conf = os.path.join(self.tmp, "vtpm-manager.conf")
        pki = self.cluster.pki  # type: ignore[union-attr]
        with open(conf, "w") as f:
            f.write(
                "[vtpm_manager]\n"
                f"swtpm_storage_dir = {self.config.swtpm_storage_dir}\n"
                f"localca_dir = {self.localca}\n"
                f"registrar_url = {self.cluster.registrar_url}\n"  # type: ignore[union-attr]
                f"cert_file = {pki}/vtpm-manager.pem\n"
                f"key_file = {pki}/vtpm-manager-key.pem\n"
                f"ca_file = {pki}/ca.pem\n"
            )
        script = os.path.join(os.path.dirname(sys.executable), "trusted-vtpm-manager")
        # As libvirtd runs /etc/libvirt/hooks/qemu: name, op, subop, extra.
        run = subprocess.run(
            [script, "--config-file", conf, "--json", "hook", dom.name(),
             "prepare", "begin", "-"],
            input=dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE),
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        self.assertEqual(0, run.returncode, run.stderr)
        self.assertIn("registered under", json.loads(run.stdout)["action"])
        state = self.manager.state_dir(dom.UUIDString())
        ek = swtpm_state.read_ek(state)
        self.assertEqual(ek, self.registered(dom.UUIDString()))
        dom.create()
        self.assertEqual(1, len(self.swtpm_serving(state)))
        self.assertEqual(ek, swtpm_state.read_ek(state))
        # Another phase is a no-op; a TPM 1.2 domain is refused clearly.
        tpm12 = domain_xml(
            "x", str(uuid_mod.uuid4()), "/dev/null",
            tpm="<tpm><backend type='emulator' version='1.2'/></tpm>",
        )  # fmt: skip
        for args, code, text in (
            (["release", "end", "-"], 0, "action=none"),
            (["prepare", "begin", "-"], 2, "supports TPM 2.0 only"),
        ):
            run = subprocess.run(
                [script, "--config-file", conf, "hook", "x", *args],
                input=tpm12, capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            self.assertEqual(code, run.returncode, run.stderr)
            self.assertIn(text, run.stdout + run.stderr)
            self.assertNotIn("Traceback", run.stderr)

    def test_guest_sees_its_vtpm(self) -> None:
        dom = self.define(boot=True)
        result = self.manager.ensure(dom.name())
        dom.create()

        def log() -> str:
            try:
                with open(self.serial, encoding="utf-8", errors="replace") as f:
                    return f.read()
            except OSError:
                return ""

        self.assertTrue(wait_for(lambda: "VTPM-GUEST: done" in log(), 180), log())
        self.assertIn("VTPM-GUEST: found /dev/tpm0", log())
        self.assertIn("VTPM-GUEST: tpm_version_major=2", log())
        self.assertEqual(
            swtpm_state.read_ek(result.state_dir),
            self.registered(result.instance_uuid),
        )

    def test_agent_must_register_with_the_provider_registered_ek(self) -> None:
        dom = self.define()
        result = self.manager.ensure(dom.name())
        instance = result.instance_uuid
        # The guest's view of its vTPM: a copy of the state served by swtpm.
        copy = os.path.join(self.tmp, f"guest-{instance}")
        shutil.copytree(result.state_dir, copy)
        impostor_dir = os.path.join(self.tmp, f"impostor-{instance}")
        statuses = []
        for state in (impostor_dir, copy):
            swtpm = Swtpm(state, free_port_pair(), self.localca)
            swtpm.start()
            self.addCleanup(swtpm.stop)
            with Tpm(swtpm.tcti) as tpm:
                status, body = self._agent_register(
                    instance, tpm.ek_public(), tpm.ek_certificate(), tpm.ak_public()
                )
            statuses.append((status, body.get("error", {}).get("code")))
        self.assertEqual([(409, "ek_not_provider"), (200, None)], statuses)

    def test_second_domain_claiming_the_instance_is_refused(self) -> None:
        first, second = self.define(), self.define()
        instance = str(uuid_mod.uuid4())
        self.manager.ensure(first.name(), instance)
        with self.assertRaises(EkConflictError) as ctx:
            self.manager.ensure(second.name(), instance)
        self.assertEqual("provider_ek_conflict", ctx.exception.code)
        self.assertNotIn("<tpm", second.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
        self.assertFalse(
            os.path.exists(os.path.dirname(self.manager.state_dir(second.UUIDString())))
        )

    def test_only_the_provider_role_registers_vtpm_eks(self) -> None:
        pki = self.cluster.pki  # type: ignore[union-attr]
        agent = ProviderRegistrarClient(
            self.cluster.registrar_url,  # type: ignore[union-attr]
            tlsutil.client_context(
                f"{pki}/agent.pem", f"{pki}/agent-key.pem", f"{pki}/ca.pem"
            ),
            retries=0,
        )
        ek = swtpm_state.read_ek(os.path.join(self.tmp, "bootstrap", "tpm2"))
        with self.assertRaises(RegistrationRefusedError) as ctx:
            agent.register_ek(str(uuid_mod.uuid4()), ek)
        self.assertEqual(403, ctx.exception.status)

    def _agent_register(
        self, uuid: str, ek: bytes, ek_cert: bytes | None, ak: bytes
    ) -> tuple[int, dict[str, object]]:
        pki = self.cluster.pki  # type: ignore[union-attr]
        ctx = tlsutil.client_context(
            f"{pki}/agent.pem", f"{pki}/agent-key.pem", f"{pki}/ca.pem"
        )
        conn = http.client.HTTPSConnection(
            "127.0.0.1",
            self.cluster.registrar_port,
            context=ctx,
            timeout=30,  # type: ignore[union-attr]
        )
        _, tls_cert = tlsutil.self_signed_certificate(uuid, ["192.0.2.1"])
        body = {
            "ek_public": base64.b64encode(ek).decode(),
            "ek_certificate": base64.b64encode(ek_cert).decode() if ek_cert else None,
            "ak_public": base64.b64encode(ak).decode(),
            "tls_cert": tls_cert.decode(),
            "host": "192.0.2.1",
            "port": 8892,
        }
        try:
            conn.request(
                "POST", f"/v1/agents/{uuid}", json.dumps(body),
                {"Content-Type": "application/json"},
            )  # fmt: skip
            resp = conn.getresponse()
            return resp.status, json.loads(resp.read() or b"{}")
        finally:
            conn.close()
