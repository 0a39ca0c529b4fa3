"""The registrar binds a Nova vTPM's EK to the CA of its compute host.

The EK certificates are real: ``swtpm_setup --vmid instance-0000000N:<uuid>``
signed by two compute hosts' swtpm local CAs (as libvirt runs it for Nova),
read back from the state as the guest agent reads them. One test per
attack: another host's CA, another instance's CN, no EK certificate.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import uuid as uuid_mod
from typing import Any, ClassVar

import testtools
from aiohttp.test_utils import TestClient, TestServer

from trusted_testing.softtpm import SoftTpm
from verifier.common.swtpm_localca import ek_ca_bundle
from verifier.db import make_engine, upgrade
from verifier.exceptions import NotFoundError, RequestError
from verifier.protocol.hosttrust import HostTrustMode
from verifier.protocol.tpm import TpmPublic
from verifier.registrar import Registrar, make_app
from verifier.registrar.service import Registration
from verifier.tests.dbfixture import SqliteDatabase
from vtpm_manager.identity import EkIdentity
from vtpm_manager.swtpm_state import create_state, read_ek

CERT = "-----BEGIN CERTIFICATE-----\nfake\n-----END CERTIFICATE-----\n"
ROLES = {
    "agent": ["agent"],
    "reader": ["verifier"],
    "admin": ["admin"],
    "provider": ["vtpm-manager"],
}


def _vtpm(root: str, host: str, index: int, uuid: str) -> EkIdentity:
    path = os.path.join(root, host, "swtpm", uuid, "tpm2")
    create_state(
        path, os.path.join(root, host, "localca"), f"instance-{index:08x}:{uuid}"
    )
    return read_ek(path)


class HostBoundRegistrationTest(testtools.TestCase):
    """Two compute hosts, one real vTPM on each (made once per class)."""

    root: ClassVar[str]
    uuid_a: ClassVar[str]
    uuid_b: ClassVar[str]
    ek_a: ClassVar[EkIdentity]
    ek_b: ClassVar[EkIdentity]
    ca_a: ClassVar[str]
    ca_b: ClassVar[str]

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        if not (shutil.which("swtpm_setup") and shutil.which("swtpm_localca")):
            # make deps installs swtpm-tools: a machine without them fails
            # here rather than skip the class unseen
            raise AssertionError("swtpm_setup/swtpm_localca missing (swtpm-tools)")
        cls.root = tempfile.mkdtemp(prefix="host-bound-")
        try:
            cls.uuid_a, cls.uuid_b = str(uuid_mod.uuid4()), str(uuid_mod.uuid4())
            cls.ek_a = _vtpm(cls.root, "compute-a", 1, cls.uuid_a)
            cls.ek_b = _vtpm(cls.root, "compute-b", 2, cls.uuid_b)
            cls.ca_a = ek_ca_bundle(
                os.path.join(cls.root, "compute-a", "localca")
            ).decode()
            cls.ca_b = ek_ca_bundle(
                os.path.join(cls.root, "compute-b", "localca")
            ).decode()
        except BaseException:
            shutil.rmtree(cls.root, ignore_errors=True)
            raise

    @classmethod
    def tearDownClass(cls) -> None:
        shutil.rmtree(cls.root, ignore_errors=True)
        super().tearDownClass()

    def setUp(self) -> None:
        super().setUp()
        self.engine = self.useFixture(SqliteDatabase()).engine
        # hosts are not attested here: the gate is off (test_registrar_host_trust)
        self.registrar = Registrar(self.engine, host_trust=HostTrustMode.OFF)
        self.ak = SoftTpm(ak_alg="ecc", ek_alg="ecc").ak

    def enrol_both(self) -> None:
        self.assertTrue(
            self.registrar.hosts.put_host_ca("compute-a", self.ca_a, "vtpm-manager")
        )
        self.registrar.hosts.put_host_ca("compute-b", self.ca_b, "vtpm-manager")

    def registration(
        self, uuid: str, ek: EkIdentity, cert: bytes | None | str = "same"
    ) -> Registration:
        return Registration(
            uuid=uuid,
            ek_public=ek.ek_public,
            ek_certificate=ek.ek_certificate if cert == "same" else cert,  # type: ignore[arg-type]
            ak_public=self.ak.to_bytes(),
            tls_cert=CERT,
            host="192.0.2.7",
            port=8892,
        )

    def refused(self, reg: Registration, anonymous: bool = True) -> str:
        with self.assertRaises(RequestError) as ctx:
            self.registrar.register(reg, anonymous)
        self.assertEqual(403, ctx.exception.status)
        self.assertEqual([], self.registrar.list())
        with self.assertRaises(NotFoundError):  # nothing pending either
            self.registrar.activate(reg.uuid, b"\0" * 32)
        return ctx.exception.code

    def test_vtpm_on_its_placed_host_registers_anonymously(self) -> None:
        self.enrol_both()
        self.registrar.hosts.put_placement(self.uuid_a, "compute-a", "listener")
        challenge = self.registrar.register(
            self.registration(self.uuid_a, self.ek_a), True
        )
        self.assertTrue(challenge.credential_blob)

    def test_ek_certificate_from_another_hosts_ca_is_refused(self) -> None:
        self.enrol_both()
        # Nova placed instance B on compute-a, but its vTPM's EK certificate
        # was made by compute-b's CA: a vTPM from elsewhere.
        self.registrar.hosts.put_placement(self.uuid_b, "compute-a", "listener")
        code = self.refused(self.registration(self.uuid_b, self.ek_b))
        self.assertEqual("ek_certificate_other_host", code)

    def test_ek_certificate_naming_another_instance_is_refused(self) -> None:
        self.enrol_both()
        # A's genuine vTPM (signed by compute-a) claims to be instance C,
        # which Nova placed on compute-a too.
        other = str(uuid_mod.uuid4())
        self.registrar.hosts.put_placement(other, "compute-a", "listener")
        self.registrar.hosts.put_placement(self.uuid_a, "compute-a", "listener")
        code = self.refused(self.registration(other, self.ek_a), anonymous=False)
        self.assertEqual("ek_certificate_other_instance", code)

    def test_no_ek_certificate_when_the_host_has_a_ca_is_refused(self) -> None:
        self.enrol_both()
        self.registrar.hosts.put_placement(self.uuid_a, "compute-a", "listener")
        code = self.refused(self.registration(self.uuid_a, self.ek_a, None), False)
        self.assertEqual("ek_certificate_missing", code)

    def test_placed_host_without_a_ca_fails_closed(self) -> None:
        self.enrol_both()
        self.registrar.hosts.put_placement(self.uuid_a, "compute-c", "listener")
        code = self.refused(self.registration(self.uuid_a, self.ek_a))
        self.assertEqual("host_ca_unknown", code)

    def test_host_signed_ek_of_an_instance_not_yet_placed_is_refused(self) -> None:
        self.enrol_both()
        code = self.refused(self.registration(self.uuid_a, self.ek_a))
        self.assertEqual("instance_host_unknown", code)

    def test_certificate_for_another_key_than_the_ek_is_refused(self) -> None:
        self.enrol_both()
        self.registrar.hosts.put_placement(self.uuid_a, "compute-a", "listener")
        swapped = EkIdentity(self.ek_b.ek_public, self.ek_a.ek_certificate)
        self.assertEqual(
            "ek_certificate", self.refused(self.registration(self.uuid_a, swapped))
        )

    def test_deleted_placement_forgets_the_pending_registration(self) -> None:
        self.enrol_both()
        self.registrar.hosts.put_placement(self.uuid_a, "compute-a", "listener")
        self.registrar.register(self.registration(self.uuid_a, self.ek_a), True)
        self.registrar.hosts.delete_placement(self.uuid_a)
        with self.assertRaises(NotFoundError):  # nothing pending any more
            self.registrar.activate(self.uuid_a, b"\0" * 32)
        # and a deleted instance's vTPM cannot register again
        code = self.refused(self.registration(self.uuid_a, self.ek_a))
        self.assertEqual("instance_host_unknown", code)

    def test_resized_instance_keeps_its_origin_hosts_ek(self) -> None:
        self.enrol_both()
        self.registrar.hosts.put_placement(self.uuid_a, "compute-a", "listener")
        self.assertFalse(
            self.registrar.hosts.put_placement(self.uuid_a, "compute-b", "listener")
        )
        self.assertEqual(
            ("compute-b", "compute-a"), self.registrar.hosts.get_placement(self.uuid_a)
        )
        self.registrar.register(self.registration(self.uuid_a, self.ek_a), True)

    def test_without_enrolled_host_cas_the_ek_anchors_apply_as_before(self) -> None:
        self.registrar.hosts.put_placement(self.uuid_a, "compute-a", "listener")
        reg = self.registration(self.uuid_a, self.ek_a)
        with self.assertRaises(RequestError) as ctx:
            self.registrar.register(reg, True)
        self.assertEqual("anonymous_registration_disabled", ctx.exception.code)
        from verifier.protocol.ekcert import load_anchors

        anchored = Registrar(
            self.engine,
            load_anchors(self.ca_a.encode()),
            host_trust=HostTrustMode.OFF,
        )
        self.assertTrue(anchored.register(reg, True).credential_blob)
        TpmPublic.from_bytes(reg.ek_public)  # the real EK parses


class HostCaApiTest(testtools.TestCase):
    """``/v1/provider/hosts/{host}`` and ``/v1/provider/instances/{uuid}``."""

    def setUp(self) -> None:
        super().setUp()
        if not shutil.which("swtpm_localca"):
            self.skipTest("swtpm_localca missing")
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.tmp = tmp.name
        engine = make_engine("sqlite:///" + os.path.join(tmp.name, "r.db"))
        self.addCleanup(engine.dispose)
        upgrade(engine)
        self.registrar = Registrar(engine)

    def call(self, *requests: tuple[str, str, Any], roles: Any = None) -> list[Any]:
        async def go() -> list[tuple[int, Any]]:
            out = []
            app = make_app(self.registrar, roles)
            async with TestClient(TestServer(app)) as client:
                for method, path, body in requests:
                    resp = await client.request(method, path, json=body)
                    data = None if resp.status == 204 else await resp.json()
                    out.append((resp.status, data))
            return out

        return asyncio.run(go())

    def test_enrol_replace_read_and_remove_a_host_ca(self) -> None:
        ek = _vtpm(self.tmp, "compute-a", 1, str(uuid_mod.uuid4()))
        self.assertTrue(ek.ek_certificate)
        pem = ek_ca_bundle(os.path.join(self.tmp, "compute-a", "localca")).decode()
        path = "/v1/provider/hosts/compute-a"
        body = {"ca_certificate": pem}
        answers = self.call(
            ("PUT", path, body),
            ("PUT", path, body),
            ("GET", path, None),
            ("DELETE", path, None),
            ("GET", path, None),
        )
        self.assertEqual([201, 200, 200, 204, 404], [a[0] for a in answers])
        self.assertEqual(pem, answers[2][1]["ca_certificate"])
        self.assertEqual("unknown_host", answers[4][1]["error"]["code"])

    def test_bad_host_ca_is_a_named_400_and_nothing_is_stored(self) -> None:
        path = "/v1/provider/hosts/compute-a"
        answers = self.call(
            ("PUT", path, {"ca_certificate": "not a PEM"}),
            ("PUT", path, {"ca_certificate": CERT}),
            ("PUT", path, {"ca_certificate": "x" * (33 * 1024)}),
            ("PUT", path, {"ca": "x"}),
            ("PUT", "/v1/provider/hosts/-bad", {"ca_certificate": CERT}),
            ("GET", path, None),
        )
        codes = [(s, d["error"]["code"]) for s, d in answers]
        self.assertEqual(400, codes[0][0])
        self.assertEqual("bad_host_ca", codes[0][1])
        self.assertEqual((400, "bad_host_ca"), codes[1])
        self.assertEqual(400, codes[2][0])
        self.assertEqual(400, codes[3][0])
        self.assertEqual(400, codes[4][0])
        self.assertEqual((404, "unknown_host"), codes[5])

    def test_a_leaf_certificate_is_not_a_host_ca(self) -> None:
        ek = _vtpm(self.tmp, "compute-a", 1, str(uuid_mod.uuid4()))
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization

        assert ek.ek_certificate is not None
        leaf = x509.load_der_x509_certificate(ek.ek_certificate)
        pem = leaf.public_bytes(serialization.Encoding.PEM).decode()
        [(status, data)] = self.call(
            ("PUT", "/v1/provider/hosts/compute-a", {"ca_certificate": pem})
        )
        self.assertEqual((400, "bad_host_ca"), (status, data["error"]["code"]))
        self.assertIn("not a CA certificate", data["error"]["message"])

    def test_placement_put_update_and_delete(self) -> None:
        uuid = str(uuid_mod.uuid4())
        path = f"/v1/provider/instances/{uuid}"
        answers = self.call(
            ("PUT", path, {"host": "compute-a"}),
            ("PUT", path, {"host": "compute-b"}),
            ("GET", path, None),
            ("DELETE", path, None),
            ("DELETE", path, None),
            ("PUT", path, {"host": "a b"}),
            ("PUT", "/v1/provider/instances/nope", {"host": "compute-a"}),
        )
        self.assertEqual([201, 200, 200, 204, 404, 400, 400], [a[0] for a in answers])
        self.assertEqual("compute-b", answers[2][1]["host"])
        self.assertEqual("compute-a", answers[2][1]["origin_host"])
        self.assertEqual("bad_field", answers[5][1]["error"]["code"])

    def test_only_the_provider_may_enrol_or_place(self) -> None:
        uuid = str(uuid_mod.uuid4())
        answers = self.call(
            ("PUT", "/v1/provider/hosts/compute-a", {"ca_certificate": CERT}),
            ("DELETE", "/v1/provider/hosts/compute-a", None),
            ("PUT", f"/v1/provider/instances/{uuid}", {"host": "compute-a"}),
            ("DELETE", f"/v1/provider/instances/{uuid}", None),
            roles=ROLES,
        )
        for status, data in answers:  # no certificate: no identity
            self.assertEqual((401, "unauthorized"), (status, data["error"]["code"]))
