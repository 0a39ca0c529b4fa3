"""The libvirt hook at ``prepare begin`` of Nova's encrypted vTPM: it
reads and makes nothing (the vTPM secret is Nova's), and lets the domain
start only when this host's CA is enrolled at the (real, in-process)
registrar."""

from __future__ import annotations

import datetime
import os
import shutil
import tempfile
import uuid as uuid_mod

import testtools
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from trusted_testing.registrar import ThreadRegistrar
from trusted_testing.softtpm import SoftTpm
from vtpm_manager.exceptions import VtpmError
from vtpm_manager.hook import on_prepare
from vtpm_manager.identity import EkIdentity
from vtpm_manager.manager import ManagerConfig
from vtpm_manager.registrar_client import ProviderRegistrarClient
from vtpm_manager.tests.unit.test_domain_xml import _domain

NOVA_TPM = (
    "<tpm model='tpm-crb'><backend type='emulator' version='2.0'>"
    "<encryption secret='{secret}'/></backend></tpm>"
)


def _ca_pem() -> str:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "swtpm-localca")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM).decode()


class NovaVtpmHookTest(testtools.TestCase):
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
        tmp = tempfile.mkdtemp(prefix="vtpm-hook-")
        self.addCleanup(shutil.rmtree, tmp, True)
        self.storage = os.path.join(tmp, "swtpm")
        self.host = f"compute-{uuid_mod.uuid4().hex[:8]}"
        self.config = ManagerConfig(
            self.storage, os.path.join(tmp, "ca"), host=self.host
        )
        self.client = ProviderRegistrarClient(self.server.url, retries=0)
        self.xml = _domain(NOVA_TPM.format(secret=uuid_mod.uuid4()))

    def test_refused_while_the_hosts_ca_is_not_enrolled(self) -> None:
        with self.assertRaises(VtpmError) as ctx:
            on_prepare(self.xml, self.config, self.client)
        self.assertIn(
            "is not enrolled: run 'trusted-vtpm-manager enrol-host'", str(ctx.exception)
        )
        self.assertFalse(os.path.exists(self.storage))

    def test_enrolled_host_starts_it_without_touching_the_state(self) -> None:
        self.assertTrue(self.client.enrol_host(self.host, _ca_pem()))
        done = on_prepare(self.xml, self.config, self.client)
        self.assertIn(f"bound to the CA of {self.host}", str(done))
        self.assertFalse(os.path.exists(self.storage))  # nothing made or read
        self.assertTrue(self.client.unenrol_host(self.host))
        self.assertRaises(VtpmError, on_prepare, self.xml, self.config, self.client)

    def test_provider_ek_registered_by_ensure_still_starts_it(self) -> None:
        from vtpm_manager import domain_xml

        uuid = domain_xml.parse_domain(self.xml).uuid
        ek = EkIdentity(SoftTpm(ak_alg="ecc", ek_alg="rsa").ek.to_bytes(), None)
        self.client.register_ek(uuid, ek)
        self.addCleanup(self.client.deregister, uuid)
        done = on_prepare(self.xml, self.config, self.client)
        self.assertIn("already registered", str(done))
