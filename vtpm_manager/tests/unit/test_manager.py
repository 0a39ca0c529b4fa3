"""VtpmManager on libvirt's ``test:///default`` driver, with real
swtpm_setup and the real registrar app (in-process, plain HTTP)."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid as uuid_mod

import libvirt
import testtools

from trusted_testing.registrar import ThreadRegistrar
from trusted_testing.softtpm import SoftTpm
from vtpm_manager import swtpm_state
from vtpm_manager.exceptions import (
    DomainNotFoundError,
    EkConflictError,
    RegistrarUnavailableError,
    SwtpmSetupError,
    UnsupportedTpmError,
)
from vtpm_manager.manager import ManagerConfig, VtpmManager
from vtpm_manager.registrar_client import ProviderRegistrarClient
from vtpm_manager.tests.unit.test_domain_xml import TPM12, _domain

_LOCALCA: str | None = None


def _localca() -> str:
    """One local CA for the whole module (swtpm_localca makes it once)."""
    global _LOCALCA
    if _LOCALCA is None:
        _LOCALCA = tempfile.mkdtemp(prefix="vtpm-unit-ca-")
    return _LOCALCA


class ManagerTest(testtools.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.server = ThreadRegistrar()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.server.close()
        if _LOCALCA:
            shutil.rmtree(_LOCALCA, ignore_errors=True)
        super().tearDownClass()

    def setUp(self) -> None:
        super().setUp()
        self.conn = libvirt.open("test:///default")
        self.addCleanup(self.conn.close)
        tmp = tempfile.mkdtemp(prefix="vtpm-unit-")
        self.addCleanup(shutil.rmtree, tmp, True)
        self.config = ManagerConfig(
            swtpm_storage_dir=os.path.join(tmp, "swtpm"), localca_dir=_localca()
        )
        self.client = ProviderRegistrarClient(self.server.url, retries=1, backoff=0)
        self.manager = VtpmManager(self.conn, self.client, self.config)

    def define(self, tpm: str = "") -> libvirt.virDomain:
        dom = self.conn.defineXML(_domain(tpm))
        self.addCleanup(self._drop, dom)
        return dom

    @staticmethod
    def _drop(dom: libvirt.virDomain) -> None:
        try:
            if dom.isActive():
                dom.destroy()
            dom.undefine()
        except libvirt.libvirtError:
            pass

    def test_ensure_adds_device_makes_state_and_registers_ek(self) -> None:
        dom = self.define()
        result = self.manager.ensure(dom.name())
        self.assertTrue(result.device_added)
        self.assertTrue(result.state_created and result.newly_registered)
        self.assertFalse(result.pending_cold_boot)
        self.assertEqual(dom.UUIDString(), result.instance_uuid)
        self.assertIn("<tpm model='tpm-crb'>", dom.XMLDesc(0))
        self.assertTrue(swtpm_state.has_state(result.state_dir))
        ek = swtpm_state.read_ek(result.state_dir)
        self.assertIsNotNone(ek.ek_certificate)
        self.assertEqual(ek, self.client.get_ek(result.instance_uuid))
        again = self.manager.ensure(dom.UUIDString())
        self.assertFalse(
            again.device_added or again.state_created or again.newly_registered
        )

    def test_running_domain_gets_the_device_at_next_cold_boot(self) -> None:
        dom = self.define()
        dom.create()
        instance = str(uuid_mod.uuid4())
        result = self.manager.ensure(dom.name(), instance, "tpm-tis")
        self.assertTrue(result.pending_cold_boot)
        self.assertIn("next cold boot", result.summary())
        self.assertNotIn("<tpm", dom.XMLDesc(0))  # the live domain: unchanged
        self.assertIn(
            "<tpm model='tpm-tis'>", dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
        )
        self.assertIsNotNone(self.client.get_ek(instance))

    def test_concurrent_ensures_of_one_domain_make_one_state(self) -> None:
        import threading

        dom = self.define()
        results, errors = [], []

        def ensure() -> None:
            try:
                results.append(self.manager.ensure(dom.name()))
            except Exception as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=ensure) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual([], errors)
        self.assertEqual(1, sum(r.state_created for r in results))
        self.assertEqual(1, sum(r.newly_registered for r in results))
        self.assertEqual(
            swtpm_state.read_ek(results[0].state_dir),
            self.client.get_ek(dom.UUIDString()),
        )

    def test_unknown_domain(self) -> None:
        for name in ("no-such-domain", str(uuid_mod.uuid4())):
            with self.assertRaises(DomainNotFoundError) as ctx:
                self.manager.ensure(name)
            self.assertIn(name, str(ctx.exception))

    def test_tpm12_domain_is_refused_and_nothing_is_made(self) -> None:
        dom = self.define(TPM12)
        self.assertRaises(UnsupportedTpmError, self.manager.ensure, dom.name())
        self.assertFalse(os.path.exists(self.config.swtpm_storage_dir))
        self.assertIsNone(self.client.get_ek(dom.UUIDString()))

    def test_swtpm_setup_failure_leaves_nothing(self) -> None:
        # A local CA whose signing key is garbage: swtpm_localca, and so the
        # real swtpm_setup, fail to make the EK certificate.
        broken_ca = tempfile.mkdtemp(prefix="vtpm-unit-badca-")
        self.addCleanup(shutil.rmtree, broken_ca, True)
        for name in ("signkey.pem", "issuercert.pem", "certserial"):
            with open(os.path.join(broken_ca, name), "w") as f:
                f.write("garbage\n")
        manager = VtpmManager(
            self.conn,
            self.client,
            ManagerConfig(self.config.swtpm_storage_dir, broken_ca),
        )
        dom = self.define()
        with self.assertRaises(SwtpmSetupError) as ctx:
            manager.ensure(dom.name())
        self.assertIn("swtpm_setup failed", str(ctx.exception))
        leftovers = os.listdir(self.config.swtpm_storage_dir)
        self.assertEqual([], [n for n in leftovers if not n.endswith(".vtpm-lock")])
        self.assertNotIn("<tpm", dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
        self.assertIsNone(self.client.get_ek(dom.UUIDString()))

    def test_registrar_down_retries_with_backoff_and_leaves_no_half_state(
        self,
    ) -> None:
        delays: list[float] = []
        down = ProviderRegistrarClient(
            "http://127.0.0.1:9", retries=3, backoff=0.01, sleep=delays.append
        )
        manager = VtpmManager(self.conn, down, self.config)
        dom = self.define()
        with self.assertRaises(RegistrarUnavailableError) as ctx:
            manager.ensure(dom.name())
        self.assertIn("after 4 attempts", str(ctx.exception))
        self.assertEqual([0.01, 0.02, 0.04], delays)
        self.assertNotIn("<tpm", dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
        self.assertFalse(
            os.path.exists(os.path.dirname(self.manager.state_dir(dom.UUIDString())))
        )

    def test_instance_registered_with_another_ek_is_refused_loudly(self) -> None:
        dom = self.define()
        instance = str(uuid_mod.uuid4())
        other = SoftTpm(ak_alg="ecc", ek_alg="rsa").ek.to_bytes()
        self.client.register_ek(instance, swtpm_state.EkIdentity(other, None))
        with self.assertRaises(EkConflictError) as ctx:
            self.manager.ensure(dom.name(), instance)
        self.assertEqual(409, ctx.exception.status)
        self.assertIn("another vTPM EK", str(ctx.exception))
        self.assertEqual(other, self.client.get_ek(instance).ek_public)  # type: ignore[union-attr]
        self.assertNotIn("<tpm", dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
        self.assertFalse(
            os.path.exists(os.path.dirname(self.manager.state_dir(dom.UUIDString())))
        )

    def test_undefine_deregisters_and_deletes_or_keeps_state(self) -> None:
        for keep in (False, True):
            dom = self.define()
            result = self.manager.ensure(dom.name())
            self.assertTrue(self.manager.undefine(dom.name(), keep_state=keep))
            self.assertRaises(DomainNotFoundError, self.manager.ensure, result.domain)
            self.assertIsNone(self.client.get_ek(result.instance_uuid))
            self.assertEqual(keep, swtpm_state.has_state(result.state_dir))
        self.assertTrue(self.manager.forget(result.instance_uuid, result.domain_uuid)
                        is False)  # fmt: skip
        self.assertFalse(swtpm_state.has_state(result.state_dir))
