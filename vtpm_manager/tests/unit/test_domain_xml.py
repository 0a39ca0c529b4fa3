"""The TPM device XML logic, checked against libvirt's own parser
(``test:///default``)."""

from __future__ import annotations

import uuid as uuid_mod
import xml.etree.ElementTree as ET

import libvirt
import testtools

from vtpm_manager import domain_xml
from vtpm_manager.exceptions import UnsupportedTpmError, VtpmError


def _domain(tpm: str = "", name: str | None = None) -> str:
    name = name or f"vtpm-unit-{uuid_mod.uuid4().hex[:8]}"
    return (
        f"<domain type='test'><name>{name}</name><uuid>{uuid_mod.uuid4()}</uuid>"
        "<memory>1024</memory><os><type>hvm</type></os>"
        f"<devices>{tpm}</devices></domain>"
    )


TPM12 = "<tpm model='tpm-tis'><backend type='emulator' version='1.2'/></tpm>"
TPM_DEFAULT_VERSION = "<tpm model='tpm-tis'><backend type='emulator'/></tpm>"
PASSTHROUGH = (
    "<tpm model='tpm-tis'><backend type='passthrough'>"
    "<device path='/dev/tpm0'/></backend></tpm>"
)


class DomainXmlTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.conn = libvirt.open("test:///default")
        self.addCleanup(self.conn.close)

    def _libvirt_roundtrip(self, xml: str) -> domain_xml.DomainInfo:
        dom = self.conn.defineXML(xml)
        self.addCleanup(dom.undefine)
        return domain_xml.parse_domain(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))

    def test_adds_crb_device_in_novas_form(self) -> None:
        xml, changed = domain_xml.ensure_tpm(_domain(), "tpm-crb")
        self.assertTrue(changed)
        tpm = ET.fromstring(xml).find("./devices/tpm")
        assert tpm is not None
        self.assertEqual("tpm-crb", tpm.get("model"))
        backend = tpm.find("backend")
        assert backend is not None
        self.assertEqual({"type": "emulator", "version": "2.0"}, backend.attrib)
        info = self._libvirt_roundtrip(xml)
        self.assertEqual(domain_xml.TpmDevice("tpm-crb", None), info.tpm)

    def test_adds_tis_device_with_encryption_secret(self) -> None:
        secret = str(uuid_mod.uuid4())
        xml, changed = domain_xml.ensure_tpm(_domain(), "tpm-tis", secret)
        self.assertTrue(changed)
        info = self._libvirt_roundtrip(xml)
        self.assertEqual(domain_xml.TpmDevice("tpm-tis", secret), info.tpm)

    def test_existing_tpm2_device_is_kept_as_nova_made_it(self) -> None:
        secret = str(uuid_mod.uuid4())
        original = _domain(
            "<tpm model='tpm-tis'><backend type='emulator' version='2.0'>"
            f"<encryption secret='{secret}'/></backend></tpm>"
        )
        xml, changed = domain_xml.ensure_tpm(original, "tpm-crb")
        self.assertFalse(changed)
        self.assertEqual(original, xml)
        self.assertEqual("tpm-tis", domain_xml.parse_domain(xml).tpm.model)  # type: ignore[union-attr]

    def test_tpm12_device_is_refused(self) -> None:
        for tpm in (TPM12, TPM_DEFAULT_VERSION):
            with self.assertRaises(UnsupportedTpmError) as ctx:
                domain_xml.ensure_tpm(_domain(tpm), "tpm-crb")
            self.assertIn("TPM 1.2", str(ctx.exception))

    def test_passthrough_tpm_is_refused(self) -> None:
        with self.assertRaises(UnsupportedTpmError) as ctx:
            domain_xml.parse_domain(_domain(PASSTHROUGH))
        self.assertIn("passthrough", str(ctx.exception))

    def test_bad_model_and_bad_xml(self) -> None:
        self.assertRaises(VtpmError, domain_xml.ensure_tpm, _domain(), "tpm-spapr")
        self.assertRaises(VtpmError, domain_xml.parse_domain, "<domain><oops")
        self.assertRaises(VtpmError, domain_xml.parse_domain, "<network/>")
        self.assertRaises(VtpmError, domain_xml.parse_domain, "<domain/>")

    def test_domain_without_tpm(self) -> None:
        info = domain_xml.parse_domain(_domain(name="plain"))
        self.assertEqual("plain", info.name)
        self.assertIsNone(info.tpm)
