"""Provider (vTPM) EK registrations in the registrar: service and REST API."""

from __future__ import annotations

import asyncio
import base64
import os
import tempfile
import uuid as uuid_mod

import testtools
from aiohttp.test_utils import TestClient, TestServer

from trusted_testing.softtpm import SoftTpm
from verifier.db import make_engine, upgrade
from verifier.exceptions import ConflictError, NotFoundError
from verifier.registrar import Registrar, make_app
from verifier.registrar.service import Registration
from verifier.tests.dbfixture import SqliteDatabase

TLS_CERT = "-----BEGIN CERTIFICATE-----\nfake\n-----END CERTIFICATE-----\n"


class ProviderEkTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.engine = self.useFixture(SqliteDatabase()).engine
        self.registrar = Registrar(self.engine)
        self.vtpm = SoftTpm(ak_alg="ecc", ek_alg="ecc")
        self.uuid = str(uuid_mod.uuid4())

    def agent_registration(self, tpm: SoftTpm) -> Registration:
        return Registration(
            uuid=self.uuid,
            ek_public=tpm.ek.to_bytes(),
            ek_certificate=None,
            ak_public=tpm.ak.to_bytes(),
            tls_cert=TLS_CERT,
            host="192.0.2.7",
            port=8892,
        )

    def provide(self, tpm: SoftTpm | None = None) -> bool:
        tpm = tpm or self.vtpm
        return self.registrar.register_provider_ek(
            self.uuid, tpm.ek.to_bytes(), None, "vtpm-manager"
        )

    def test_provider_registration_is_idempotent(self) -> None:
        self.assertTrue(self.provide())
        self.assertFalse(self.provide())
        rec = self.registrar.get_provider_ek(self.uuid.upper())
        self.assertEqual(self.vtpm.ek.to_bytes(), rec.ek_public)
        self.assertEqual("vtpm-manager", rec.provider)

    def test_second_provider_registration_with_other_ek_is_refused(self) -> None:
        self.provide()
        with self.assertRaises(ConflictError) as ctx:
            self.provide(SoftTpm(ak_alg="ecc", ek_alg="ecc"))
        self.assertEqual("provider_ek_conflict", ctx.exception.code)
        self.assertEqual(
            self.vtpm.ek.to_bytes(), self.registrar.get_provider_ek(self.uuid).ek_public
        )

    def test_agent_with_the_provider_ek_registers(self) -> None:
        self.provide()
        challenge = self.registrar.register(self.agent_registration(self.vtpm))
        credential = self.vtpm.activate_credential(
            challenge.credential_blob, challenge.encrypted_secret
        )
        self.registrar.activate(self.uuid, credential)
        self.assertTrue(self.registrar.get(self.uuid).activated)

    def test_agent_with_another_ek_is_refused(self) -> None:
        self.provide()
        impostor = SoftTpm(ak_alg="ecc", ek_alg="ecc")
        with self.assertRaises(ConflictError) as ctx:
            self.registrar.register(self.agent_registration(impostor))
        self.assertEqual("ek_not_provider", ctx.exception.code)
        self.assertRaises(NotFoundError, self.registrar.get, self.uuid)

    def test_provider_ek_conflicting_with_agent_registration_is_refused(
        self,
    ) -> None:
        challenge = self.registrar.register(self.agent_registration(self.vtpm))
        self.registrar.activate(
            self.uuid,
            self.vtpm.activate_credential(
                challenge.credential_blob, challenge.encrypted_secret
            ),
        )
        with self.assertRaises(ConflictError) as ctx:
            self.provide(SoftTpm(ak_alg="ecc", ek_alg="ecc"))
        self.assertEqual("provider_ek_conflict", ctx.exception.code)
        self.assertRaises(NotFoundError, self.registrar.get_provider_ek, self.uuid)

    def test_pending_registration_with_other_ek_than_provider_cannot_activate(
        self,
    ) -> None:
        impostor = SoftTpm(ak_alg="ecc", ek_alg="ecc")
        challenge = self.registrar.register(self.agent_registration(impostor))
        self.provide()
        credential = impostor.activate_credential(
            challenge.credential_blob, challenge.encrypted_secret
        )
        with self.assertRaises(ConflictError) as ctx:
            self.registrar.activate(self.uuid, credential)
        self.assertEqual("ek_not_provider", ctx.exception.code)
        self.assertRaises(NotFoundError, self.registrar.get, self.uuid)

    def test_delete_forgets_provider_ek_and_agent(self) -> None:
        self.provide()
        self.registrar.register(self.agent_registration(self.vtpm))
        self.registrar.delete_provider_ek(self.uuid)
        self.assertRaises(NotFoundError, self.registrar.get_provider_ek, self.uuid)
        self.assertRaises(NotFoundError, self.registrar.get, self.uuid)
        self.assertRaises(NotFoundError, self.registrar.delete_provider_ek, self.uuid)


class ProviderEkApiTest(testtools.TestCase):
    """The REST endpoints, without TLS (roles unchecked)."""

    def setUp(self) -> None:
        super().setUp()
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        engine = make_engine("sqlite:///" + os.path.join(tmp.name, "r.db"))
        self.addCleanup(engine.dispose)
        upgrade(engine)
        self.app = make_app(Registrar(engine))
        self.uuid = str(uuid_mod.uuid4())

    async def _exchange(self) -> list[tuple[int, dict[str, object] | None]]:
        ek = base64.b64encode(SoftTpm(ak_alg="ecc").ek.to_bytes()).decode()
        other = base64.b64encode(SoftTpm(ak_alg="ecc").ek.to_bytes()).decode()
        path = f"/v1/agents/{self.uuid}/ek"
        out: list[tuple[int, dict[str, object] | None]] = []
        async with TestClient(TestServer(self.app)) as client:
            for method, body in (
                ("PUT", {"ek_public": ek}),
                ("PUT", {"ek_public": ek}),
                ("PUT", {"ek_public": other}),
                ("PUT", {"ek_public": "not base64!"}),
                ("GET", None),
                ("DELETE", None),
                ("GET", None),
            ):
                resp = await client.request(method, path, json=body)
                data = None if resp.status == 204 else await resp.json()
                out.append((resp.status, data))
        return out

    def test_put_get_delete(self) -> None:
        results = asyncio.run(self._exchange())
        statuses = [s for s, _ in results]
        self.assertEqual([201, 200, 409, 400, 200, 204, 404], statuses)
        self.assertEqual(
            "provider_ek_conflict",
            results[2][1]["error"]["code"],  # type: ignore[index]
        )
        self.assertEqual("anonymous", results[4][1]["provider"])  # type: ignore[index]
