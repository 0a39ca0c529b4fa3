"""The registrar's host gate over its database and API: ``PUT
/v1/hosts/{host}/trust`` (the verifier's word on a compute host) and the
registrations it lets through (``[registrar] host_trust = required``).

The vTPMs are real (``swtpm_setup --vmid``, each compute host's own
``swtpm_localca``); a host's proven CA digest is the sha256 of its
``issuercert.pem`` file, as the host's IMA list shows it.
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import os
import shutil
import tempfile
import time
import unittest
import uuid as uuid_mod
from typing import Any, ClassVar

import testtools
from aiohttp.test_utils import TestClient, TestServer

from trusted_testing.softtpm import SoftTpm
from verifier.common.swtpm_localca import ek_ca_bundle
from verifier.exceptions import NotFoundError, RequestError
from verifier.protocol.hosttrust import HostTrust, HostTrustMode, issuer_file_part
from verifier.registrar import Registrar, make_app
from verifier.registrar.service import Registration
from verifier.tests.dbfixture import SqliteDatabase
from verifier.tests.unit.test_registrar_host_bound import CERT, _vtpm
from vtpm_manager.identity import EkIdentity

PROVIDER = str(uuid_mod.uuid4())


def _iso(seconds: float) -> str:
    when = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    return when.isoformat().replace("+00:00", "Z")


class _Hosts(testtools.TestCase):
    """Two compute hosts, one real vTPM on compute-a (made once per class)."""

    root: ClassVar[str]
    uuid_a: ClassVar[str]
    ek_a: ClassVar[EkIdentity]
    ca_a: ClassVar[str]
    ca_b: ClassVar[str]
    issuer_a: ClassVar[bytes]
    issuer_b: ClassVar[bytes]

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        if not (shutil.which("swtpm_setup") and shutil.which("swtpm_localca")):
            raise unittest.SkipTest("swtpm_setup/swtpm_localca missing")
        cls.root = tempfile.mkdtemp(prefix="host-trust-")
        try:
            cls.uuid_a = str(uuid_mod.uuid4())
            cls.ek_a = _vtpm(cls.root, "compute-a", 1, cls.uuid_a)
            _vtpm(cls.root, "compute-b", 2, str(uuid_mod.uuid4()))
            cls.ca_a, cls.issuer_a = cls._ca("compute-a")
            cls.ca_b, cls.issuer_b = cls._ca("compute-b")
        except BaseException:
            shutil.rmtree(cls.root, ignore_errors=True)
            raise

    @classmethod
    def _ca(cls, host: str) -> tuple[str, bytes]:
        localca = os.path.join(cls.root, host, "localca")
        with open(os.path.join(localca, "issuercert.pem"), "rb") as f:
            return ek_ca_bundle(localca).decode(), f.read()

    @classmethod
    def tearDownClass(cls) -> None:
        shutil.rmtree(cls.root, ignore_errors=True)
        super().tearDownClass()

    def setUp(self) -> None:
        super().setUp()
        self.engine = self.useFixture(SqliteDatabase()).engine
        self.registrar = Registrar(self.engine)  # host_trust required: the default
        self.ak = SoftTpm(ak_alg="ecc", ek_alg="ecc").ak
        self.hosts = self.registrar.hosts
        self.hosts.put_host_ca("compute-a", self.ca_a, "vtpm-manager")
        self.hosts.put_host_ca("compute-b", self.ca_b, "vtpm-manager")
        self.hosts.put_placement(self.uuid_a, "compute-a", "listener")

    def trust(self, trusted: bool, ca_file: bytes | None, at: float = 0.0) -> None:
        digest = hashlib.sha256(ca_file).hexdigest() if ca_file is not None else None
        self.hosts.put_trust(
            "compute-a", HostTrust(trusted, digest, PROVIDER, at or time.time())
        )

    def registration(self) -> Registration:
        return Registration(
            uuid=self.uuid_a,
            ek_public=self.ek_a.ek_public,
            ek_certificate=self.ek_a.ek_certificate,
            ak_public=self.ak.to_bytes(),
            tls_cert=CERT,
            host="192.0.2.7",
            port=8892,
        )

    def refused(self) -> str:
        with self.assertRaises(RequestError) as ctx:
            self.registrar.register(self.registration(), True)
        self.assertEqual(403, ctx.exception.status)
        return ctx.exception.code


class HostTrustRegistrationTest(_Hosts):
    def test_the_enrolled_bundles_issuer_part_is_the_issuercert_file(self) -> None:
        # what read_host_ca / ek_ca_bundle enrol begins with the file bytes
        # swtpm_localca wrote, so the file's IMA digest proves the enrolment
        self.assertEqual(self.issuer_a, issuer_file_part(self.ca_a.encode()))

    def test_vtpm_of_a_trusted_host_with_its_proven_ca_registers(self) -> None:
        self.trust(True, self.issuer_a)
        self.assertTrue(self.registrar.register(self.registration(), True))

    def test_vtpm_of_a_host_never_reported_is_refused(self) -> None:
        self.assertEqual("host_untrusted", self.refused())
        self.assertEqual([], self.registrar.list())

    def test_vtpm_of_an_untrusted_host_is_refused(self) -> None:
        self.trust(True, self.issuer_a)
        self.trust(False, self.issuer_a)
        self.assertEqual("host_untrusted", self.refused())

    def test_vtpm_of_a_host_that_proved_another_ca_is_refused(self) -> None:
        self.trust(True, self.issuer_b)  # compute-a now reads another CA file
        self.assertEqual("host_ca_unproven", self.refused())

    def test_an_older_word_never_re_trusts_a_failed_host(self) -> None:
        now = time.time()
        self.trust(False, self.issuer_a, at=now)
        self.trust(True, self.issuer_a, at=now - 5)  # a delayed retry
        self.assertEqual("host_untrusted", self.refused())
        held = self.hosts.get_trust("compute-a")
        assert held is not None
        self.assertFalse(held.trusted)

    def test_trust_of_a_host_with_no_ca_enrolled_is_not_stored(self) -> None:
        with self.assertRaises(NotFoundError):
            self.hosts.put_trust("compute-c", HostTrust(True, None, PROVIDER, 1.0))
        with self.assertRaises(NotFoundError):
            self.hosts.get_trust("compute-c")

    def test_the_gate_is_off_when_configured_off(self) -> None:
        registrar = Registrar(self.engine, host_trust=HostTrustMode.OFF)
        self.assertTrue(registrar.register(self.registration(), True))


class HostTrustApiTest(_Hosts):
    """``PUT|GET /v1/hosts/{host}/trust`` (no TLS here: roles unchecked;
    the certificate roles are in test_host_ca_gate, functional)."""

    def call(self, *requests: tuple[str, str, Any]) -> list[tuple[int, Any]]:
        async def go() -> list[tuple[int, Any]]:
            out = []
            app = make_app(self.registrar)
            async with TestClient(TestServer(app)) as client:
                for method, path, body in requests:
                    resp = await client.request(method, path, json=body)
                    out.append((resp.status, await resp.json()))
            return out

        return asyncio.run(go())

    def body(self, **changes: Any) -> dict[str, Any]:
        body = {
            "trusted": True,
            "ca_sha256": hashlib.sha256(self.issuer_a).hexdigest(),
            "provider": PROVIDER,
            "as_of": _iso(time.time()),
        }
        body.update(changes)
        return body

    def test_put_then_get_the_trust_of_a_host(self) -> None:
        path = "/v1/hosts/compute-a/trust"
        body = self.body()
        (s0, before), (s1, put), (s2, got) = self.call(
            ("GET", path, None), ("PUT", path, body), ("GET", path, None)
        )
        self.assertEqual((200, False, None), (s0, before["trusted"], before["as_of"]))
        self.assertEqual(200, s1)
        self.assertTrue(put["applied"])
        self.assertEqual(200, s2)
        for field in ("trusted", "ca_sha256", "provider"):
            self.assertEqual(body[field], got[field])
        self.assertTrue(self.registrar.register(self.registration(), True))

    def test_an_older_put_is_answered_not_applied(self) -> None:
        path = "/v1/hosts/compute-a/trust"
        now = time.time()
        (_, first), (status, second) = self.call(
            ("PUT", path, self.body(trusted=False, as_of=_iso(now))),
            ("PUT", path, self.body(as_of=_iso(now - 60))),
        )
        self.assertEqual((200, False), (status, second["applied"]))
        self.assertFalse(second["trusted"])

    def test_bad_trust_bodies_are_a_400_naming_the_field(self) -> None:
        path = "/v1/hosts/compute-a/trust"
        bad = {
            "trusted": self.body(trusted="yes"),
            "ca_sha256": self.body(ca_sha256="ABC"),
            "provider": self.body(provider=42),
            "as_of": self.body(as_of="yesterday"),
            "extra": self.body(extra=1),
        }
        answers = self.call(*(("PUT", path, b) for b in bad.values()))
        for field, (status, data) in zip(bad, answers, strict=True):
            self.assertEqual(400, status, field)
            self.assertIn(f"'{field}'", data["error"]["message"])
        [(status, data)] = self.call(("PUT", path, self.body(as_of="2026-01-01T00:00")))
        self.assertEqual(400, status)
        self.assertIn("time zone", data["error"]["message"])
        [(status, data)] = self.call(("PUT", path, self.body(provider="not-a-uuid")))
        self.assertEqual((400, "malformed"), (status, data["error"]["code"]))
        self.assertIsNone(self.hosts.get_trust("compute-a"))  # nothing stored

    def test_trust_of_a_host_with_no_ca_enrolled_is_a_404(self) -> None:
        [(status, data)] = self.call(("PUT", "/v1/hosts/compute-c/trust", self.body()))
        self.assertEqual((404, "unknown_host"), (status, data["error"]["code"]))
        [(status, data)] = self.call(("PUT", "/v1/hosts/-bad/trust", self.body()))
        self.assertEqual((400, "bad_host"), (status, data["error"]["code"]))
