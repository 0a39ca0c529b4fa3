"""Unit tests of the node agent and its REST API (SoftTpm, no real TPM)."""

import asyncio
import base64
import dataclasses
import hashlib
import json
import os
import stat
import tempfile
import uuid as uuid_mod
from unittest import mock

import testtools
from aiohttp.test_utils import TestClient, TestServer
from cryptography import x509

from node_agent.agent import Agent, TpmAccess
from node_agent.exceptions import RefusedError
from node_agent.server import make_app
from trusted_testing.softtpm import SoftTpm
from verifier.ca import CertificateAuthority
from verifier.protocol import (
    AttestationKey,
    EnvelopeError,
    EvidenceError,
    PcrPolicy,
    Quote,
    TpmPublic,
    bind_nonce,
    generate_key,
    seal_payload,
    seal_share,
    split,
    verify_quote,
)

SCRIPT = b'#!/bin/sh\necho hello > marker\necho "$TRUSTED_NODE_UUID" > uuid\nexit 3\n'


class SoftTpmAdapter:
    """node_agent's TPM interface on top of trusted_testing.SoftTpm."""

    def __init__(self, soft=None):
        self.soft = soft or SoftTpm()
        self.closed = 0

    def ek_public(self):
        return self.soft.ek.to_bytes()

    def ek_certificate(self):
        return None

    def ak_public(self):
        return self.soft.ak.to_bytes()

    def activate_credential(self, blob, secret):
        return self.soft.activate_credential(blob, secret)

    def quote(self, qualifying_data, pcrs, banks=("sha256",)):
        return self.soft.quote(qualifying_data, tuple(pcrs), banks)

    def close(self):
        self.closed += 1


def _b64(data):
    return base64.b64encode(data).decode()


class AgentTestBase(testtools.TestCase):
    def setUp(self):
        super().setUp()
        self.tmp = tempfile.TemporaryDirectory(prefix="test-agent-")
        self.addCleanup(self.tmp.cleanup)
        self.work_dir = os.path.join(self.tmp.name, "work")
        self.uuid = str(uuid_mod.uuid4())
        self.tpm = SoftTpmAdapter()
        self.agent = Agent(
            self.uuid,
            TpmAccess(lambda: self.tpm, shared=True),
            self.work_dir,
            payload_timeout=10,
        )

    def run_async(self, coro):
        return asyncio.run(coro)

    def inputs(self, plaintext=SCRIPT, uuid=None):
        """(U envelope, V envelope, payload envelope) for this agent."""
        uuid = uuid or self.uuid
        key = generate_key()
        u, v = split(key)
        nk = self.agent.nk_public
        return (
            seal_share(nk, u, "U", uuid),
            seal_share(nk, v, "V", uuid),
            seal_payload(key, plaintext, uuid),
        )

    def identity_cert(self):
        ca = CertificateAuthority.create(os.path.join(self.tmp.name, "ca"), "id CA")
        return ca.sign_csr(self.agent.csr_der, self.uuid)

    def path(self, name):
        return os.path.join(self.work_dir, name)


class TestBootstrap(AgentTestBase):
    def _check_bootstrapped(self, cert):
        agent = self.agent
        self.assertTrue(agent.bootstrapped)
        self.assertIsNotNone(agent.bootstrapped_at)
        status = agent.status()
        self.assertEqual(
            {
                "uuid": self.uuid,
                "bootstrapped": True,
                "has_u": False,
                "has_v": False,
                "payload_exit_code": 3,
                "last_error": None,
            },
            status,
        )
        with open(self.path("marker")) as f:
            self.assertEqual("hello\n", f.read())
        with open(self.path("uuid")) as f:
            self.assertEqual(self.uuid + "\n", f.read())
        with open(self.path("payload.status")) as f:
            self.assertEqual(3, json.load(f)["exit_code"])
        self.assertTrue(os.path.exists(self.path("payload.out")))
        self.assertEqual(0o700, stat.S_IMODE(os.stat(self.path("payload")).st_mode))
        with open(self.path("identity.pem"), "rb") as f:
            self.assertEqual(cert, f.read())
        key_mode = stat.S_IMODE(os.stat(self.path("identity-key.pem")).st_mode)
        self.assertEqual(0o600, key_mode)
        # No share or key material is kept in memory.
        self.assertIsNone(agent._u)
        self.assertIsNone(agent._v)

    def test_u_then_v(self):
        u_env, v_env, payload = self.inputs()
        cert = self.identity_cert()

        async def go():
            self.assertFalse(await self.agent.receive_u(u_env, payload))
            self.assertTrue(self.agent.status()["has_u"])
            self.assertFalse(self.agent.bootstrapped)
            self.assertTrue(await self.agent.receive_v(v_env, cert))
            self.assertEqual(3, await self.agent.wait_payload())

        self.run_async(go())
        self._check_bootstrapped(cert)

    def test_payload_and_its_outcome_are_synced_to_disk(self):
        """The payload runs once: its output, status and installed files
        are fsync'ed, so a node reset afterwards cannot leave an empty
        payload.out (seen in the guest story's hard reset)."""
        u_env, v_env, payload = self.inputs()
        cert = self.identity_cert()
        synced = []

        def spy(fd):
            synced.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
            real_fsync(fd)

        real_fsync = os.fsync

        async def go():
            with mock.patch("node_agent.payload.os.fsync", side_effect=spy):
                await self.agent.receive_u(u_env, payload)
                await self.agent.receive_v(v_env, cert)
                self.assertEqual(3, await self.agent.wait_payload())

        self.run_async(go())
        for name in (
            "payload",
            "payload.out",
            "payload.status",
            "identity.pem",
            "identity-key.pem",
        ):
            self.assertIn(name, synced)
        self.assertLess(synced.index("payload"), synced.index("payload.out"))

    def test_v_then_u(self):
        u_env, v_env, payload = self.inputs()
        cert = self.identity_cert()

        async def go():
            self.assertFalse(await self.agent.receive_v(v_env, cert))
            self.assertTrue(self.agent.status()["has_v"])
            self.assertTrue(await self.agent.receive_u(u_env, payload))
            self.assertEqual(3, await self.agent.wait_payload())

        self.run_async(go())
        self._check_bootstrapped(cert)

    def test_non_script_payload_is_stored_not_run(self):
        u_env, v_env, payload = self.inputs(plaintext=b"just data")

        async def go():
            await self.agent.receive_u(u_env, payload)
            await self.agent.receive_v(v_env, None)
            self.assertIsNone(await self.agent.wait_payload())

        self.run_async(go())
        self.assertTrue(self.agent.bootstrapped)
        with open(self.path("payload"), "rb") as f:
            self.assertEqual(b"just data", f.read())
        self.assertFalse(os.path.exists(self.path("identity.pem")))

    def test_u_for_other_node_refused(self):
        u_env, _, payload = self.inputs(uuid=str(uuid_mod.uuid4()))
        self.assertRaises(
            EnvelopeError, self.run_async, self.agent.receive_u(u_env, payload)
        )
        self.assertFalse(self.agent.status()["has_u"])
        self.assertFalse(os.path.exists(self.path("payload")))

    def test_tampered_v_refused(self):
        _, v_env, _ = self.inputs()
        tampered = v_env[:-1] + bytes([v_env[-1] ^ 1])
        self.assertRaises(
            EnvelopeError, self.run_async, self.agent.receive_v(tampered, None)
        )
        self.assertFalse(self.agent.status()["has_v"])

    def test_u_as_v_refused(self):
        u_env, _, _ = self.inputs()
        self.assertRaises(
            EnvelopeError, self.run_async, self.agent.receive_v(u_env, None)
        )

    def test_shares_mismatch_keeps_earlier_share(self):
        u_env, v_env, payload = self.inputs()
        _, other_v, _ = self.inputs()

        async def go():
            await self.agent.receive_u(u_env, payload)
            exc = None
            try:
                await self.agent.receive_v(other_v, None)
            except RefusedError as e:
                exc = e
            self.assertIsNotNone(exc)
            self.assertEqual("shares_mismatch", exc.code)
            self.assertEqual(400, exc.status)
            self.assertEqual(
                {"has_u": True, "has_v": False, "bootstrapped": False},
                {k: self.agent.status()[k] for k in ("has_u", "has_v", "bootstrapped")},
            )
            # The right V still completes the bootstrap.
            self.assertTrue(await self.agent.receive_v(v_env, None))
            await self.agent.wait_payload()

        self.run_async(go())
        self.assertTrue(self.agent.bootstrapped)

    def test_identity_cert_for_other_key_refused(self):
        _, v_env, _ = self.inputs()
        ca = CertificateAuthority.create(os.path.join(self.tmp.name, "ca"), "id CA")
        _, other_cert = ca.issue(self.uuid, [])
        exc = self.assertRaises(
            RefusedError, self.run_async, self.agent.receive_v(v_env, other_cert)
        )
        self.assertEqual("bad_identity_cert", exc.code)
        self.assertFalse(self.agent.status()["has_v"])

    def test_second_bootstrap_refused(self):
        u_env, v_env, payload = self.inputs(plaintext=b"data")

        async def go():
            await self.agent.receive_u(u_env, payload)
            await self.agent.receive_v(v_env, None)
            await self.agent.receive_u(u_env, payload)

        exc = self.assertRaises(RefusedError, self.run_async, go())
        self.assertEqual(409, exc.status)

    def test_payload_timeout_kills(self):
        self.agent.payload_timeout = 0.5
        u_env, v_env, payload = self.inputs(plaintext=b"#!/bin/sh\nsleep 30\n")

        async def go():
            await self.agent.receive_u(u_env, payload)
            await self.agent.receive_v(v_env, None)
            return await self.agent.wait_payload()

        code = self.run_async(go())
        self.assertEqual(-9, code)
        with open(self.path("payload.status")) as f:
            self.assertEqual({"exit_code": -9, "timed_out": True}, json.load(f))


class TestQuote(AgentTestBase):
    def _verify(self, result, qualifying, pcrs=(16, 17)):
        quote = Quote.from_dict(result.to_dict()["quote"])
        ak = AttestationKey(TpmPublic.from_bytes(self.tpm.ak_public()), True)
        policy = PcrPolicy({i: frozenset({bytes(32)}) for i in pcrs})
        return verify_quote(quote, ak=ak, qualifying_data=qualifying, policy=policy)

    def test_quote_binds_nk(self):
        nonce = os.urandom(16)
        result = self.run_async(self.agent.quote(nonce, [16, 17], False))
        self.assertNotIn("csr", result.to_dict())
        nk = base64.b64decode(result.to_dict()["nk"])
        self.assertEqual(self.agent.nk_public, nk)
        self.assertTrue(self._verify(result, bind_nonce(nonce, nk)))
        self.assertEqual(1, self.tpm.closed)  # shared: closed after use

    def test_quote_binds_nk_and_csr(self):
        nonce = os.urandom(32)
        result = self.run_async(self.agent.quote(nonce, [16, 17], True))
        nk = base64.b64decode(result.to_dict()["nk"])
        csr = base64.b64decode(result.to_dict()["csr"])
        csr_obj = x509.load_der_x509_csr(csr)
        self.assertEqual(self.uuid, csr_obj.subject.rfc4514_string()[3:])
        self.assertTrue(self._verify(result, bind_nonce(nonce, nk, csr)))
        # Without the CSR bound, the quote does not verify.
        exc = self.assertRaises(
            EvidenceError, self._verify, result, bind_nonce(nonce, nk)
        )
        self.assertEqual("nonce_mismatch", exc.reason)


class TestAgentApi(AgentTestBase):
    async def _client(self):
        client = TestClient(TestServer(make_app(self.agent)))
        await client.start_server()
        return client

    def _request(self, method, path, **kwargs):
        async def go():
            client = await self._client()
            try:
                resp = await client.request(method, path, **kwargs)
                return resp.status, await resp.json()
            finally:
                await client.close()

        return self.run_async(go())

    def _assert_error(self, status, code, result, mentions=None):
        got_status, body = result
        self.assertEqual(status, got_status, body)
        self.assertEqual(code, body["error"]["code"])
        if mentions:
            self.assertIn(mentions, body["error"]["message"])

    def test_quote_ok(self):
        nonce = os.urandom(8).hex()
        status, body = self._request("GET", f"/v1/quote?nonce={nonce}&pcrs=16,17&csr=1")
        self.assertEqual(200, status)
        self.assertEqual({"quote", "nk", "csr"}, set(body))
        self.assertEqual({"16", "17"}, set(body["quote"]["pcrs"]))

    def test_quote_without_banks_is_the_sha256_form(self):
        # what a verifier that knows no "banks" asks and reads (issue 32)
        nonce = os.urandom(8).hex()
        status, body = self._request("GET", f"/v1/quote?nonce={nonce}&pcrs=0,16")
        self.assertEqual(200, status)
        self.assertEqual({"attest", "signature", "pcrs"}, set(body["quote"]))

    def test_quote_over_the_sha1_bank_too(self):
        # issue 32 item 5: a legacy SHA-1 log is judged against sha1 PCRs
        self.tpm.soft.extend_sha1(0, hashlib.sha1(b"crtm").digest())
        nonce = os.urandom(8)
        status, body = self._request(
            "GET", f"/v1/quote?nonce={nonce.hex()}&pcrs=0,16&banks=sha256,sha1"
        )
        self.assertEqual(200, status, body)
        quote = Quote.from_dict(body["quote"])
        ak = AttestationKey(TpmPublic.from_bytes(self.tpm.ak_public()), True)
        nk = base64.b64decode(body["nk"])
        verdict = verify_quote(
            quote,
            ak=ak,
            qualifying_data=bind_nonce(nonce, nk),
            policy=PcrPolicy({16: frozenset({bytes(32)})}),
        )
        self.assertEqual(
            {0: self.tpm.soft.sha1_pcrs[0], 16: bytes(20)}, verdict.bank_values["sha1"]
        )
        self.assertEqual({0: bytes(32), 16: bytes(32)}, dict(verdict.pcr_values))
        # the sha1 values are covered by the signature
        lying = {**quote.bank_values["sha1"], 0: bytes(20)}
        exc = self.assertRaises(
            EvidenceError,
            verify_quote,
            dataclasses.replace(quote, bank_values={"sha1": lying}),
            ak=ak,
            qualifying_data=bind_nonce(nonce, nk),
            policy=PcrPolicy({16: frozenset({bytes(32)})}),
        )
        self.assertEqual("pcr_digest_mismatch", exc.reason)

    def test_bad_banks(self):
        nonce = "00" * 16
        for banks in ("sha384", "sha1", "sha256,sha256", "sha256,md5"):
            result = self._request(
                "GET", f"/v1/quote?nonce={nonce}&pcrs=16&banks={banks}"
            )
            self._assert_error(400, "bad_banks", result, "banks")

    def test_bad_nonce_hex(self):
        result = self._request("GET", "/v1/quote?nonce=zz11223344556677&pcrs=16")
        self._assert_error(400, "bad_nonce", result, "nonce")

    def test_nonce_length(self):
        short = self._request("GET", "/v1/quote?nonce=00112233&pcrs=16")
        self._assert_error(400, "bad_nonce", short, "nonce")
        long = self._request("GET", f"/v1/quote?nonce={'00' * 33}&pcrs=16")
        self._assert_error(400, "bad_nonce", long, "nonce")
        missing = self._request("GET", "/v1/quote?pcrs=16")
        self._assert_error(400, "bad_nonce", missing, "nonce")

    def test_bad_pcrs(self):
        nonce = "00" * 16
        for pcrs in ("24", "a", "16,,17", "-1", ",".join(["1"] * 25), ""):
            result = self._request("GET", f"/v1/quote?nonce={nonce}&pcrs={pcrs}")
            self._assert_error(400, "bad_pcrs", result, "pcrs")

    def test_bad_csr_flag(self):
        result = self._request("GET", f"/v1/quote?nonce={'00' * 16}&pcrs=16&csr=yes")
        self._assert_error(400, "bad_csr", result, "csr")

    def test_deeply_nested_json_is_400_bad_json(self):
        # Issue 18: answered 500 (RecursionError in json.loads).
        deep = b'{"u": ' + b"[" * 20_000 + b"]" * 20_000 + b"}"
        result = self._request("POST", "/v1/keys/u", data=deep)
        self._assert_error(400, "bad_json", result, "nested")

    def test_integer_over_64_bits_is_400_bad_json(self):
        result = self._request("POST", "/v1/keys/v", data=b'{"v": 1' + b"0" * 30 + b"}")
        self._assert_error(400, "bad_json", result, "out of range")

    def test_bad_json(self):
        result = self._request("POST", "/v1/keys/u", data=b"{not json")
        self._assert_error(400, "bad_json", result)
        result = self._request("POST", "/v1/keys/v", data=b"[1, 2]")
        self._assert_error(400, "bad_json", result)

    def test_bad_base64(self):
        result = self._request(
            "POST", "/v1/keys/u", json={"u": "***", "payload": _b64(b"x")}
        )
        self._assert_error(400, "bad_field", result, "'u'")
        result = self._request("POST", "/v1/keys/v", json={"v": "not base64!"})
        self._assert_error(400, "bad_field", result, "'v'")

    def test_identity_cert_that_is_not_a_certificate_is_refused(self):
        _, v_env, _ = self.inputs()
        body = {"v": _b64(v_env), "identity_cert": "not a certificate"}
        result = self._request("POST", "/v1/keys/v", json=body)
        self._assert_error(400, "malformed", result, "'identity_cert'")
        self.assertFalse(self.agent.status()["has_v"])

    def test_unknown_share_field_is_refused(self):
        u_env, _, payload = self.inputs()
        body = {"u": _b64(u_env), "payload": _b64(payload), "payload_uuid": "x"}
        result = self._request("POST", "/v1/keys/u", json=body)
        self._assert_error(400, "bad_field", result, "'payload_uuid'")
        self.assertFalse(self.agent.status()["has_u"])

    def test_bad_envelope(self):
        u_env, _, payload = self.inputs(uuid=str(uuid_mod.uuid4()))
        result = self._request(
            "POST", "/v1/keys/u", json={"u": _b64(u_env), "payload": _b64(payload)}
        )
        self._assert_error(400, "envelope", result)

    def test_bootstrap_over_http(self):
        u_env, v_env, payload = self.inputs(plaintext=b"data")
        cert = self.identity_cert().decode()

        async def go():
            client = await self._client()
            try:
                r = await client.post(
                    "/v1/keys/v", json={"v": _b64(v_env), "identity_cert": cert}
                )
                self.assertEqual(200, r.status)
                self.assertEqual(
                    {"accepted": "v", "bootstrapped": False}, await r.json()
                )
                r = await client.post(
                    "/v1/keys/u", json={"u": _b64(u_env), "payload": _b64(payload)}
                )
                self.assertEqual(
                    {"accepted": "u", "bootstrapped": True}, await r.json()
                )
                r = await client.get("/v1/status")
                return await r.json()
            finally:
                await client.close()

        status = self.run_async(go())
        self.assertTrue(status["bootstrapped"])
        self.assertEqual(self.uuid, status["uuid"])


class TestRegister(AgentTestBase):
    """Registration against the real registrar app over plain HTTP."""

    def _register(self, agent):
        import verifier.db
        import verifier.registrar

        engine = verifier.db.make_engine(
            f"sqlite:///{os.path.join(self.tmp.name, 'r.sqlite')}"
        )
        verifier.db.upgrade(engine)
        self.addCleanup(engine.dispose)
        registrar = verifier.registrar.Registrar(engine)

        async def go():
            server = TestServer(verifier.registrar.make_app(registrar))
            await server.start_server()
            try:
                agent.registrar_url = str(server.make_url("")).rstrip("/")
                await agent.register()
            finally:
                await server.close()

        try:
            self.run_async(go())
        finally:
            self.record = registrar.get(self.uuid) if registrar.list() else None

    def test_register_and_activate(self):
        self._register(self.agent)
        self.assertTrue(self.record.activated)
        self.assertEqual(self.tpm.ak_public(), self.record.ak_public)
        self.assertEqual(self.agent.tls_cert_pem.decode(), self.record.tls_cert)

    def test_wrong_credential_is_registration_error(self):
        from node_agent.exceptions import RegistrationError

        self.tpm.activate_credential = lambda blob, secret: b"\x00" * 32
        exc = self.assertRaises(RegistrationError, self._register, self.agent)
        self.assertIn("403", str(exc))
        self.assertIn("activation_failed", str(exc))
        self.assertFalse(exc.retryable)
        self.assertIsNone(self.record)  # nothing in force before activation

    def test_unreachable_registrar_is_retryable(self):
        from node_agent.exceptions import RegistrationError

        self.agent.registrar_url = "http://127.0.0.1:1"
        exc = self.assertRaises(
            RegistrationError, self.run_async, self.agent.register()
        )
        self.assertTrue(exc.retryable)
