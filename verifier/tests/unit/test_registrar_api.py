"""The registrar's REST API with the typed registration messages: what it
now refuses (JSON 4xx, nothing stored) and the record it serves."""

from __future__ import annotations

import asyncio
import os
import tempfile
import uuid as uuid_mod
from typing import Any

import fixtures
import testtools
from aiohttp.test_utils import TestClient, TestServer

from trusted_testing.softtpm import SoftTpm
from verifier.common.tls import self_signed_certificate
from verifier.db import make_engine, upgrade
from verifier.protocol.messages.registration import (
    MAX_LOOKUP,
    ActivationChallenge,
    ActivationProof,
    AgentLookup,
    AgentLookupResult,
    RegistrationRecord,
    RegistrationRequest,
)
from verifier.registrar import Registrar, make_app
from verifier.registrar.service import Registration

CERT = self_signed_certificate("agent", ["192.0.2.7"])[1].decode()


class RegistrarApiBase(testtools.TestCase):
    """The REST endpoints, without TLS (roles unchecked): a registrar on a
    temporary database and a software TPM; no tests."""

    def setUp(self) -> None:
        super().setUp()
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        engine = make_engine("sqlite:///" + os.path.join(tmp.name, "r.db"))
        self.addCleanup(engine.dispose)
        upgrade(engine)
        self.registrar = Registrar(engine)
        self.tpm = SoftTpm(ak_alg="ecc", ek_alg="ecc")
        self.uuid = str(uuid_mod.uuid4())
        self.body = RegistrationRequest(
            self.tpm.ek, None, self.tpm.ak, CERT, "192.0.2.7", 8892
        ).to_dict()

    def call(self, *requests: tuple[str, str, Any]) -> list[tuple[int, Any]]:
        async def go() -> list[tuple[int, Any]]:
            out = []
            app = make_app(self.registrar)  # one per event loop
            async with TestClient(TestServer(app)) as client:
                for method, path, body in requests:
                    resp = await client.request(method, path, json=body)
                    data = None if resp.status == 204 else await resp.json()
                    out.append((resp.status, data))
            return out

        return asyncio.run(go())


class RegistrarApiTest(RegistrarApiBase):
    """Registration, activation and the record."""

    def assert_refused(self, changes: dict[str, Any], code: str, field: str) -> None:
        path = f"/v1/agents/{self.uuid}"
        [(status, data)] = self.call(("POST", path, self.body | changes))
        self.assertEqual((400, code), (status, data["error"]["code"]), data)
        self.assertIn(f"'{field}'", data["error"]["message"])
        self.assertEqual([], self.registrar.list())

    def test_register_activate_and_read_the_record(self) -> None:
        path = f"/v1/agents/{self.uuid}"
        [(status, answer)] = self.call(("POST", path, self.body))
        self.assertEqual(200, status, answer)
        challenge = ActivationChallenge.from_dict(answer)
        credential = self.tpm.activate_credential(
            challenge.credential_blob, challenge.encrypted_secret
        )
        proof = ActivationProof(credential).to_dict()
        results = self.call(("POST", path + "/activate", proof), ("GET", path, None))
        self.assertEqual({"uuid": self.uuid, "activated": True}, results[0][1])
        record = RegistrationRecord.from_dict(results[1][1])
        self.assertEqual(
            (self.tpm.ak, CERT, True),
            (record.ak_public, record.tls_cert, record.activated),
        )

    def test_tls_cert_that_is_not_a_certificate_is_refused(self) -> None:
        fake = "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n"
        self.assert_refused({"tls_cert": fake}, "malformed", "tls_cert")

    def test_port_out_of_range_is_refused(self) -> None:
        self.assert_refused({"port": 70000}, "bad_field", "port")
        self.assert_refused({"port": True}, "bad_field", "port")

    def test_host_that_is_not_a_host_name_is_refused(self) -> None:
        self.assert_refused({"host": "evil.org/x?"}, "malformed", "host")

    def test_unknown_field_is_refused(self) -> None:
        self.assert_refused({"ek_cert": None}, "bad_field", "ek_cert")

    def test_empty_credential_is_a_bad_field(self) -> None:
        path = f"/v1/agents/{self.uuid}/activate"
        [(status, data)] = self.call(("POST", path, {"credential": ""}))
        self.assertEqual((400, "bad_field"), (status, data["error"]["code"]))

    def test_invalid_stored_row_is_a_server_error_not_a_record(self) -> None:
        logs = self.useFixture(fixtures.FakeLogger())
        challenge = self.registrar.register(
            Registration(
                self.uuid, self.tpm.ek.to_bytes(), None, self.tpm.ak.to_bytes(),
                "not a certificate", "192.0.2.7", 8892,
            )
        )  # fmt: skip
        credential = self.tpm.activate_credential(
            challenge.credential_blob, challenge.encrypted_secret
        )
        self.registrar.activate(self.uuid, credential)
        [(status, data)] = self.call(("GET", f"/v1/agents/{self.uuid}", None))
        self.assertEqual((500, "internal"), (status, data["error"]["code"]))
        self.assertIn("'tls_cert' is not exactly one PEM", logs.output)


class AgentLookupApiTest(RegistrarApiBase):
    """``POST /v1/lookup/agents``: the records and placements of a batch of
    enrolments in one request."""

    def register(self, activate: bool = True) -> str:
        uuid = str(uuid_mod.uuid4())
        challenge = self.registrar.register(
            Registration(
                uuid, self.tpm.ek.to_bytes(), None, self.tpm.ak.to_bytes(),
                CERT, "192.0.2.7", 8892,
            )
        )  # fmt: skip
        if activate:
            credential = self.tpm.activate_credential(
                challenge.credential_blob, challenge.encrypted_secret
            )
            self.registrar.activate(uuid, credential)
        return uuid

    def test_known_nodes_come_back_with_their_placement_unknown_are_left_out(
        self,
    ) -> None:
        placed, waiting = self.register(), self.register(activate=False)
        self.registrar.hosts.put_placement(placed, "compute-1", "nova")
        unknown = str(uuid_mod.uuid4())
        body = AgentLookup((placed, waiting.upper(), unknown)).to_dict()
        [(status, data)] = self.call(("POST", "/v1/lookup/agents", body))
        self.assertEqual(200, status, data)
        result = AgentLookupResult.from_dict(data)
        got = {r.uuid: r.activated for r in result.agents}
        self.assertEqual({placed: True}, got)  # pending: not registered yet
        self.assertEqual({placed: "compute-1"}, result.placements)

    def test_a_bad_uuid_or_too_many_is_refused_naming_it(self) -> None:
        bad = {"uuids": [str(uuid_mod.uuid4()), "not-a-uuid"]}
        many = {"uuids": [str(uuid_mod.uuid4()) for _ in range(MAX_LOOKUP + 1)]}
        (s1, d1), (s2, d2), (s3, d3) = self.call(
            ("POST", "/v1/lookup/agents", bad),
            ("POST", "/v1/lookup/agents", {"uuids": []}),
            ("POST", "/v1/lookup/agents", {"uuids": ["x"], "more": 1}),
        )
        self.assertEqual((400, "malformed"), (s1, d1["error"]["code"]), d1)
        self.assertIn("uuids.1", d1["error"]["message"])
        self.assertEqual((400, "bad_field"), (s2, d2["error"]["code"]), d2)
        self.assertEqual((400, "bad_field"), (s3, d3["error"]["code"]), d3)
        self.assertIn("more", d3["error"]["message"])
        [(s4, d4)] = self.call(("POST", "/v1/lookup/agents", many))
        self.assertIn(s4, (400, 413), d4)


class AnonymousCallerApiTest(testtools.TestCase):
    """With roles checked: a caller without a client certificate (plain
    HTTP here; CERT_OPTIONAL TLS in the functional tests) may only
    register and activate, and only with an anchored EK certificate."""

    ROLES = {
        "agent": ["agent"],
        "reader": ["verifier"],
        "admin": ["admin"],
        "provider": ["vtpm-manager"],
    }

    def setUp(self) -> None:
        super().setUp()
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        engine = make_engine("sqlite:///" + os.path.join(tmp.name, "r.db"))
        self.addCleanup(engine.dispose)
        upgrade(engine)
        self.engine = engine
        self.registrar = Registrar(engine)
        self.tpm = SoftTpm(ak_alg="ecc", ek_alg="ecc")
        self.uuid = str(uuid_mod.uuid4())
        self.body = RegistrationRequest(
            self.tpm.ek, None, self.tpm.ak, CERT, "192.0.2.7", 8892
        ).to_dict()

    def call(self, *requests: tuple[str, str, Any]) -> list[tuple[int, Any]]:
        async def go() -> list[tuple[int, Any]]:
            out = []
            app = make_app(self.registrar, self.ROLES)
            async with TestClient(TestServer(app)) as client:
                for method, path, body in requests:
                    resp = await client.request(method, path, json=body)
                    data = None if resp.status == 204 else await resp.json()
                    out.append((resp.status, data))
            return out

        return asyncio.run(go())

    def test_anonymous_callers_get_401_on_read_delete_and_provider_endpoints(
        self,
    ) -> None:
        path = f"/v1/agents/{self.uuid}"
        provider = {"ek_public": self.body["ek_public"], "ek_certificate": None}
        answers = self.call(
            ("GET", "/v1/agents", None),
            ("GET", path, None),
            ("DELETE", path, None),
            ("PUT", path + "/ek", provider),
            ("GET", path + "/ek", None),
            ("DELETE", path + "/ek", None),
        )
        for status, data in answers:
            self.assertEqual((401, "unauthorized"), (status, data["error"]["code"]))

    def test_anonymous_registration_without_ek_cert_is_refused(self) -> None:
        [(status, data)] = self.call(("POST", f"/v1/agents/{self.uuid}", self.body))
        # No EK anchors configured: anonymous registration is off.
        self.assertEqual(
            (403, "anonymous_registration_disabled"), (status, data["error"]["code"])
        )
        self.registrar = Registrar(self.engine, [_anchor()])
        [(status, data)] = self.call(("POST", f"/v1/agents/{self.uuid}", self.body))
        self.assertEqual(
            (403, "ek_certificate_required"), (status, data["error"]["code"])
        )
        self.assertEqual([], self.registrar.list())


def _anchor() -> Any:
    from cryptography import x509

    return x509.load_pem_x509_certificate(CERT.encode())
