"""Integration: Nova 34's own libvirt driver makes the vTPM of a real guest.

:class:`~trusted_testing.nova.libvirt_deploy.LibvirtNovaDeployment` runs
nova-compute with ``libvirt.LibvirtDriver`` (qemu TCG) against its own
libvirtd in an emulated compute host (a private mount namespace with its
own swtpm local CA), Nova's key manager on a real OpenBao server, and the
Glance stand-in serving the real guest image (:mod:`trusted_testing.
guest_vm`). A flavor with ``hw:tpm_version=2.0`` gets a vTPM that Nova
and libvirt make — nothing of ours touches it: the domain XML carries an
encrypted TPM 2.0 emulator, the encryption key lives in the key manager,
the state under the host's ``/var/lib/libvirt/swtpm``, and deleting the
server removes all three. The same deployment pins what Nova 34 and
libvirt 9.0 do with ``hw_firmware_type=uefi`` with and without Secure
Boot (doc/source/admin/vtpm.rst, "UEFI and Secure Boot").
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid as uuid_mod
import xml.etree.ElementTree as ET
from typing import Any

import oslo_messaging
import testtools
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from oslo_config import cfg

from trusted_testing import rabbit
from trusted_testing.guest_vm import build
from trusted_testing.nova.firmware import (
    firmware_descriptor,
    nova_guest_xml,
    wait_for_console,
)
from trusted_testing.nova.libvirt_deploy import LibvirtNovaDeployment
from trusted_testing.registrar import ThreadRegistrar
from trusted_testing.softtpm import SoftTpm
from verifier.common.http import BlockingClient
from verifier.common.swtpm_localca import ek_ca_bundle
from verifier.exceptions import RequestError
from verifier.nova_listener.listener import instance_host, instance_uuid, make_listener
from verifier.protocol import EvidenceError
from verifier.protocol.ekcert import check_host_bound_ek, load_anchors
from verifier.protocol.tpm import TpmPublic
from verifier.registrar.service import Registration
from vtpm_manager import cmd as vtpm_cmd
from vtpm_manager.identity import EkIdentity
from vtpm_manager.instance_hook import VtpmInstanceHook
from vtpm_manager.registrar_client import ProviderRegistrarClient
from vtpm_manager.swtpm_state import create_state, read_ek

ACTIVE_TIMEOUT = 600.0


def _other_ca() -> x509.Certificate:
    """Another compute host's CA (same subject as swtpm's, another key)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "swtpm-localca")])
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )


def _missing() -> str | None:
    for tool in ("libvirtd", "swtpm", "swtpm_setup", "qemu-system-x86_64", "unshare"):
        if shutil.which(tool) is None and not os.path.exists(f"/usr/sbin/{tool}"):
            return f"{tool} is not installed (tools/apt-packages.txt)"
    if os.geteuid() != 0:
        return "an emulated compute host needs root (mount namespace, libvirtd)"
    broker = rabbit.missing()
    return f"multi-process Nova needs {broker}" if broker else None


class _CreateEnds:
    """Records Nova's real ``instance.create.end`` payloads off the bus."""

    filter_rule = oslo_messaging.NotificationFilter(
        event_type=r"^instance\.create\.end$"
    )

    def __init__(self) -> None:
        self.payloads: dict[str, Any] = {}

    def info(
        self, ctxt: Any, publisher: str, event: str, payload: Any, meta: Any
    ) -> Any:
        uuid = instance_uuid(payload)
        if uuid is not None:
            self.payloads[uuid] = payload
        return oslo_messaging.NotificationResult.HANDLED


class NovaLibvirtVtpmTest(testtools.TestCase):
    """One deployment for the class; each test boots and deletes a server."""

    tmp: str
    nova: LibvirtNovaDeployment
    image_id: str

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        problem = _missing()
        if problem:
            raise testtools.TestCase.skipException(problem)
        image = build()
        cls.tmp = tempfile.mkdtemp(prefix="trusted-nova-libvirt-")
        cls.nova = LibvirtNovaDeployment(cls.tmp)
        try:
            cls.nova.start()
        except BaseException:
            shutil.rmtree(cls.tmp, ignore_errors=True)
            raise
        cls.image_id = cls.nova.add_guest_image(
            image.qcow2, image.kernel, image.initrd, image.cmdline
        )
        try:  # Nova's real notifications, for the placement
            conf = cfg.ConfigOpts()
            conf([])
            cls.transport = oslo_messaging.get_notification_transport(
                conf, url=cls.nova.transport_url
            )
            cls.create_ends = _CreateEnds()
            cls.listener = make_listener(
                cls.transport, cls.create_ends, pool="placement"
            )
            cls.listener.start()
        except BaseException:
            cls.nova.stop()
            shutil.rmtree(cls.tmp, ignore_errors=True)
            raise

    @classmethod
    def tearDownClass(cls) -> None:
        try:
            cls.listener.stop()
            cls.listener.wait()
            cls.transport.cleanup()
            cls.nova.stop()
        finally:
            shutil.rmtree(cls.tmp, ignore_errors=True)
        super().tearDownClass()

    # -- helpers ----------------------------------------------------------------

    def _boot(
        self, flavor: str, status: str = "ACTIVE", image: str | None = None
    ) -> str:
        body = {
            "server": {
                "name": f"vtpm-{flavor}",
                "imageRef": image or self.image_id,
                "flavorRef": flavor,
                "networks": "none",
            }
        }
        resp = self.nova.request("POST", "/servers", json=body, microversion="2.37")
        self.assertEqual(202, resp.status_code, resp.text)
        uuid = str(resp.json()["server"]["id"])
        self.addCleanup(self._delete, uuid)
        deadline = time.monotonic() + ACTIVE_TIMEOUT
        server: dict[str, Any] | None = None
        while time.monotonic() < deadline:
            server = self.nova.server(uuid)
            if server and server["status"] in ("ACTIVE", "ERROR"):
                break
            time.sleep(1)
        self.assertIsNotNone(server)
        assert server is not None
        self.assertEqual(status, server["status"], server.get("fault"))
        return uuid

    def _delete(self, uuid: str) -> None:
        resp = self.nova.request("DELETE", f"/servers/{uuid}")
        if resp.status_code == 404:  # a cleanup after the test deleted it
            return
        self.assertEqual(204, resp.status_code, resp.text)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and self.nova.server(uuid) is not None:
            time.sleep(1)

    def _vault_keys(self) -> list[str]:
        """The keys the key manager holds (not deleted)."""
        resp = BlockingClient(timeout=10).request(
            "LIST",
            f"{self.nova.bao.url}/v1/secret/metadata",
            headers={"X-Vault-Token": self.nova.bao.root_token},
            expect_json=False,
        )
        if resp.status == 404:  # an empty mount
            return []
        self.assertTrue(resp.ok, resp.body[:300])
        live = []
        for key in json.loads(resp.body)["data"]["keys"]:
            # castellan deletes the key's data (kv v2 keeps its metadata)
            data = BlockingClient(timeout=10).request(
                "GET",
                f"{self.nova.bao.url}/v1/secret/data/{key}",
                headers={"X-Vault-Token": self.nova.bao.root_token},
                expect_json=False,
            )
            if data.ok:
                live.append(str(key))
        return live

    def _secret_value_readable(self, secret: str) -> bool:
        proc = subprocess.run(
            ["virsh", "-c", self.nova.libvirt_uri, "secret-get-value", secret],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        return proc.returncode == 0

    def _tpm(self, uuid: str) -> tuple[ET.Element, str]:
        dom = ET.fromstring(self.nova.domain_xml(uuid))
        self.assertEqual(uuid, dom.findtext("uuid"))
        tpm = dom.find("devices/tpm")
        self.assertIsNotNone(tpm, "no TPM in the domain XML")
        assert tpm is not None
        self.assertEqual("tpm-crb", tpm.get("model"))
        backend = tpm.find("backend")
        assert backend is not None
        self.assertEqual(
            ("emulator", "2.0"), (backend.get("type"), backend.get("version"))
        )
        encryption = backend.find("encryption")
        self.assertIsNotNone(encryption, "Nova's vTPM state is always encrypted")
        assert encryption is not None
        return dom, str(encryption.get("secret"))

    def _state_dir(self, uuid: str) -> str:
        return os.path.join(self.nova.host_root, "swtpm", uuid)

    def _check_gone(self, uuid: str, keys_before: list[str]) -> None:
        self.assertIsNone(self.nova.server(uuid))
        names = self.nova.virsh("list", "--all", "--uuid").split()
        self.assertNotIn(uuid, names, self.nova.virsh("list", "--all"))
        self.assertFalse(os.path.exists(self._state_dir(uuid)))
        self.assertEqual(keys_before, self._vault_keys())

    def _check_real_ek_binding(self, uuid: str, secret: str) -> EkIdentity:
        value = self.nova.virsh("secret-get-value", secret).strip()
        ek = read_ek(
            os.path.join(self._state_dir(uuid), "tpm2"),
            "rsa",
            base64.b64decode(value),
        )
        assert ek.ek_certificate is not None
        cert = x509.load_der_x509_certificate(ek.ek_certificate)
        cn = cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
        self.assertTrue(str(cn[0].value).endswith(f":{uuid}"), cn)
        public = TpmPublic.from_bytes(ek.ek_public)
        anchors = {
            self.nova.host: load_anchors(ek_ca_bundle(self.nova.localca_dir)),
            "other-host": [_other_ca()],
        }
        now = datetime.datetime.now(datetime.UTC)
        check_host_bound_ek(
            ek.ek_certificate, public, uuid, self.nova.host, anchors, now
        )
        for claimed, host, reason in (
            (str(uuid_mod.uuid4()), self.nova.host, "ek_certificate_other_instance"),
            (uuid, "other-host", "ek_certificate_other_host"),
            (uuid, None, "instance_host_unknown"),
        ):
            with self.assertRaises(EvidenceError) as ctx:
                check_host_bound_ek(
                    ek.ek_certificate, public, claimed, host, anchors, now
                )
            self.assertEqual(reason, ctx.exception.reason)
        return ek

    def _check_registrar_binding(self, uuid: str, ek: EkIdentity) -> None:
        """The registrar with this host's CA enrolled (``enrol-host``) and
        the placement from Nova's real ``instance.create.end`` (the
        listener's ``vtpm`` hook) accepts the vTPM's real EK certificate
        under the instance UUID, and refuses one from a second host's CA."""
        server = ThreadRegistrar()
        self.addCleanup(server.close)
        conf = os.path.join(self.tmp, "vtpm-manager.conf")
        localca_conf = os.path.join(self.tmp, "host-swtpm-localca.conf")
        with open(localca_conf, "w", encoding="utf-8") as f:  # as the host's
            f.write(
                f"statedir = {self.nova.localca_dir}\n"
                f"issuercert = {self.nova.localca_dir}/issuercert.pem\n"
            )
        with open(conf, "w", encoding="utf-8") as f:
            f.write(
                f"[vtpm_manager]\nregistrar_url = {server.url}\n"
                f"registrar_retries = 0\nhost = {self.nova.host}\n"
                f"localca_conf = {localca_conf}\n"
            )
        self.assertEqual(0, vtpm_cmd.main(["--config-file", conf, "enrol-host"]))
        deadline = time.monotonic() + 60
        while uuid not in self.create_ends.payloads and time.monotonic() < deadline:
            time.sleep(0.5)
        payload = self.create_ends.payloads[uuid]
        self.assertEqual(self.nova.host, instance_host(payload))
        hook_conf = cfg.ConfigOpts()
        hook_conf([])
        hook = VtpmInstanceHook(
            hook_conf, ProviderRegistrarClient(server.url, retries=0)
        )
        hook.instance_placed(uuid, str(instance_host(payload)))
        ak = SoftTpm(ak_alg="ecc", ek_alg="ecc").ak.to_bytes()

        def register(identity: EkIdentity) -> None:
            server.registrar.register(
                Registration(
                    uuid, identity.ek_public, identity.ek_certificate, ak,
                    "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n",
                    "127.0.0.1", 8892,
                ),
                anonymous=True,
            )  # fmt: skip

        register(ek)  # passes: a challenge, stored as pending
        other = os.path.join(self.tmp, "second-host")
        state = os.path.join(other, "swtpm", uuid, "tpm2")
        create_state(state, os.path.join(other, "localca"), f"instance-00000001:{uuid}")
        with self.assertRaises(RequestError) as ctx:
            register(read_ek(state))
        self.assertEqual(
            (403, "ek_certificate_other_host"),
            (ctx.exception.status, ctx.exception.code),
        )
        hook.instance_deleted(uuid)

    # -- tests ------------------------------------------------------------------

    def test_vtpm_secret_security_user(self) -> None:
        """``user``: the libvirt secret is private — nobody on the host
        (so no vTPM manager either) can read the state's key."""
        keys_before = self._vault_keys()
        uuid = self._boot("trusted-vtpm")
        _dom, secret = self._tpm(uuid)
        self.assertFalse(self._secret_value_readable(secret))
        self.assertEqual(len(keys_before) + 1, len(self._vault_keys()))
        self.assertTrue(os.path.exists(self._state_dir(uuid)))
        self._delete(uuid)
        self._check_gone(uuid, keys_before)

    def test_vtpm_secret_security_host(self) -> None:
        """``host``: the libvirt secret is public and persistent."""
        keys_before = self._vault_keys()
        uuid = self._boot("trusted-vtpm-host")
        _dom, secret = self._tpm(uuid)
        self.assertTrue(self._secret_value_readable(secret))
        self.assertEqual(len(keys_before) + 1, len(self._vault_keys()))
        state = os.path.join(self._state_dir(uuid), "tpm2", "tpm2-00.permall")
        self.assertTrue(os.path.exists(state), state)
        # with the host's secret, the EK certificate libvirt had this host's
        # local CA sign can be read back: it is bound to this host and UUID
        ek = self._check_real_ek_binding(uuid, secret)
        self._check_registrar_binding(uuid, ek)
        self._delete(uuid)
        self._check_gone(uuid, keys_before)

    def test_key_manager_unreachable_at_boot(self) -> None:
        """No key for the vTPM: the build fails, and nothing is half made
        (no domain, no vTPM state, no libvirt secret)."""
        secrets_before = self.nova.virsh("secret-list").splitlines()
        self.nova.stop_key_manager()
        try:
            uuid = self._boot("trusted-vtpm", status="ERROR")
        finally:
            self.nova.restart_key_manager()
        server = self.nova.server(uuid)
        assert server is not None
        self.assertIn("fault", server)
        self.assertNotIn(uuid, self.nova.virsh("list", "--all", "--uuid").split())
        self.assertFalse(os.path.exists(self._state_dir(uuid)))
        self.assertEqual(secrets_before, self.nova.virsh("secret-list").splitlines())
        with open(self.nova.log("nova-compute"), encoding="utf-8") as f:
            log = f.read()
        # the reason, in nova-compute's log: castellan could not reach it
        self.assertIn(
            f"[instance: {uuid}] Instance failed to spawn: "
            "castellan.common.exception.KeyManagerError",
            log,
        )

    def test_instance_without_vtpm(self) -> None:
        """A flavor without ``hw:tpm_version``: no TPM device, no state, no
        key — such a guest has no EK certificate to present, which the
        host-CA binding refuses (``ek_certificate_missing``)."""
        keys_before = self._vault_keys()
        uuid = self._boot("trusted-plain")
        dom = ET.fromstring(self.nova.domain_xml(uuid))
        self.assertIsNone(dom.find("devices/tpm"))
        self.assertFalse(os.path.exists(self._state_dir(uuid)))
        self.assertEqual(keys_before, self._vault_keys())
        with self.assertRaises(EvidenceError) as ctx:
            check_host_bound_ek(
                None,
                SoftTpm(ak_alg="ecc", ek_alg="ecc").ek,
                uuid,
                self.nova.host,
                {},
                datetime.datetime.now(datetime.UTC),
            )
        self.assertEqual("ek_certificate_missing", ctx.exception.reason)

    # -- UEFI and Secure Boot (doc/source/admin/vtpm.rst) ------------------------

    def _uefi_image(self, secure_boot: str | None) -> str:
        """A blank disk with Nova's UEFI image properties (no OS: what is
        pinned is what Nova writes, what libvirt does and what OVMF says)."""
        properties = {"hw_firmware_type": "uefi", "hw_machine_type": "q35"}
        if secure_boot is not None:
            properties["os_secure_boot"] = secure_boot
        return self.nova.add_blank_image(properties)

    def _nova_os(self, uuid: str) -> ET.Element:
        """The ``<os>`` element Nova handed libvirt for ``uuid``."""
        dom = nova_guest_xml(self.nova.log("nova-compute"), uuid)
        os_element = dom.find("os")
        assert os_element is not None
        return os_element

    def _firmware_request(self, os_element: ET.Element) -> tuple[Any, ...]:
        """(firmware, secure-boot feature, loader attributes, loader path,
        nvram) of an ``<os>`` element."""
        feature = os_element.find("firmware/feature[@name='secure-boot']")
        loader = os_element.find("loader")
        return (
            os_element.get("firmware"),
            None if feature is None else feature.get("enabled"),
            None if loader is None else dict(loader.attrib),
            None if loader is None else loader.text,
            os_element.find("nvram"),
        )

    def test_uefi_secure_boot_required_runs_ovmf_with_microsoft_keys(self) -> None:
        """``os_secure_boot=required``: Nova asks libvirt to pick a Secure
        Boot firmware (``<loader secure='yes'/>``, no path); libvirt 9.0
        picks Debian's descriptor with Microsoft's keys enrolled, turns SMM
        on, copies its variable store, and OVMF enforces Secure Boot: its
        own UEFI shell is refused with "Security Violation". A hard reboot
        keeps that firmware and its variables. ``optional`` is the same
        here (libvirt reports Secure Boot support)."""
        uuid = self._boot("trusted-vtpm", image=self._uefi_image("required"))
        self.assertEqual(
            ("efi", "yes", {"secure": "yes"}, None, None),
            self._firmware_request(self._nova_os(uuid)),
        )
        dom, _secret = self._tpm(uuid)  # with the vTPM of the flavor
        self._check_secure_boot_firmware(dom)
        console = os.path.join(self.nova.workdir, "instances", uuid, "console.log")
        text = wait_for_console(console, "No bootable option", ACTIVE_TIMEOUT)
        self.assertRegex(
            text,
            r'BdsDxe: failed to start Boot\d+ "EFI Internal Shell" from '
            r".*: Security Violation",
        )
        # a hard reboot redefines the domain from the running one: Nova
        # names the firmware libvirt picked, keeps its variable store, and
        # Secure Boot is still enforced
        self._hard_reboot(uuid)
        os_element = self._nova_os(uuid)
        nvram = os_element.find("nvram")
        assert nvram is not None
        self.assertEqual(
            (
                None,
                None,
                {"type": "pflash", "readonly": "yes", "secure": "yes"},
                "/usr/share/OVMF/OVMF_CODE_4M.ms.fd",
                nvram,
            ),
            self._firmware_request(os_element),
        )
        self.assertEqual(
            (
                "/usr/share/OVMF/OVMF_VARS_4M.ms.fd",
                f"/var/lib/libvirt/qemu/nvram/{dom.findtext('name')}_VARS.fd",
            ),
            (nvram.get("template"), nvram.text),
        )
        self.assertIsNotNone(  # SMM, copied from the running domain
            nova_guest_xml(self.nova.log("nova-compute"), uuid).find("features/smm")
        )
        self._check_secure_boot_firmware(ET.fromstring(self.nova.domain_xml(uuid)))
        text = wait_for_console(console, "No bootable option", ACTIVE_TIMEOUT)
        self.assertIn("Security Violation", text)
        self._delete(uuid)
        uuid = self._boot("trusted-vtpm", image=self._uefi_image("optional"))
        self.assertEqual(
            ("efi", "yes", {"secure": "yes"}, None, None),
            self._firmware_request(self._nova_os(uuid)),
        )
        self._check_secure_boot_firmware(ET.fromstring(self.nova.domain_xml(uuid)))

    def _hard_reboot(self, uuid: str) -> None:
        """Reboot ``uuid`` (HARD) and wait until Nova is done with it."""
        log = self.nova.log("nova-compute")
        marker = f"[instance: {uuid}] End _get_guest_xml xml="
        with open(log, encoding="utf-8") as f:
            defined = f.read().count(marker)
        resp = self.nova.request(
            "POST", f"/servers/{uuid}/action", json={"reboot": {"type": "HARD"}}
        )
        self.assertEqual(202, resp.status_code, resp.text)
        deadline = time.monotonic() + ACTIVE_TIMEOUT
        server: dict[str, Any] | None = None
        while time.monotonic() < deadline:
            server = self.nova.server(uuid)
            with open(log, encoding="utf-8") as f:
                redefined = f.read().count(marker) > defined
            if (
                server is not None
                and redefined
                and server["status"] in ("ACTIVE", "ERROR")
                and server.get("OS-EXT-STS:task_state") is None
            ):
                break
            time.sleep(1)
        assert server is not None
        self.assertEqual("ACTIVE", server["status"], server.get("fault"))

    def _check_secure_boot_firmware(self, dom: ET.Element) -> None:
        """The running domain has the firmware of Debian's descriptor with
        Secure Boot on and Microsoft's keys enrolled."""
        live = dom.find("os")
        assert live is not None
        loader = live.find("loader")
        nvram = live.find("nvram")
        assert loader is not None and nvram is not None
        self.assertIsNone(live.get("firmware"))  # resolved by libvirt
        self.assertEqual(
            {"readonly": "yes", "secure": "yes", "type": "pflash"},
            dict(loader.attrib),
        )
        self.assertEqual("/usr/share/OVMF/OVMF_CODE_4M.ms.fd", loader.text)
        name, descriptor = firmware_descriptor(str(loader.text))
        self.assertEqual("40-edk2-x86_64-secure-enrolled.json", name)
        self.assertTrue(
            {"secure-boot", "enrolled-keys", "requires-smm"}
            <= set(descriptor["features"])
        )
        self.assertEqual(
            descriptor["mapping"]["nvram-template"]["filename"],
            nvram.get("template"),
        )
        self.assertEqual(
            f"/var/lib/libvirt/qemu/nvram/{dom.findtext('name')}_VARS.fd",
            nvram.text,
        )
        smm = dom.find("features/smm")
        assert smm is not None
        self.assertEqual("on", smm.get("state"))

    def test_uefi_without_secure_boot_is_refused_by_libvirt(self) -> None:
        """``hw_firmware_type=uefi`` without Secure Boot (and
        ``os_secure_boot=disabled``): Nova writes ``<loader secure='no'/>``
        next to ``<os firmware='efi'>``, which libvirt 9.0 refuses when it
        defines the domain; the build fails and no domain is left."""
        for secure_boot in (None, "disabled"):
            uuid = self._boot(
                "trusted-vtpm", status="ERROR", image=self._uefi_image(secure_boot)
            )
            self.assertEqual(
                ("efi", "no", {"secure": "no"}, None, None),
                self._firmware_request(self._nova_os(uuid)),
            )
            self.assertNotIn(uuid, self.nova.virsh("list", "--all", "--uuid").split())
            with open(self.nova.log("nova-compute"), encoding="utf-8") as f:
                log = f.read()
            self.assertIn(
                f"[instance: {uuid}] Instance failed to spawn: "
                "libvirt.libvirtError: loader attribute 'secure' cannot be "
                "specified when firmware autoselection is enabled",
                log,
            )
