"""Trusted boot end to end: real registrar and verifier processes, agents on
real swtpm TPMs, mTLS, SQLite; attacks by in-process agents on a software
TPM that misbehave after a first honest quote. Every attack must fail
closed: the node is revoked (or never enrolled) and a signed event fires.
"""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import ssl
import tempfile
import time
import uuid as uuid_mod

import requests
import testtools
from cryptography import x509

from nova_plugin.exceptions import AttestationFailedError, ServiceError
from trusted_testing.cluster import (
    GOLDEN_MEASUREMENT,
    PCR,
    LocalCluster,
    expected_pcr,
    wait_until,
)
from trusted_testing.e2e import (
    AgentThread,
    EvilTpm,
    Http,
    make_foreign_ca,
)
from verifier.protocol import PcrPolicy, generate_key, seal_payload, seal_share, split

INTERVAL = 0.5
PAYLOAD = b'#!/bin/sh\necho "payload ran on $TRUSTED_NODE_UUID"\n'


class TrustedBootTest(testtools.TestCase):
    """One deployment for the whole module (started once, ~5 s)."""

    cluster: LocalCluster
    agents: AgentThread
    tmp: str

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.tmp = tempfile.mkdtemp(prefix="trusted-boot-")
        cls.cluster = LocalCluster(
            os.path.join(cls.tmp, "cluster"), nodes=3, interval=INTERVAL
        )
        try:
            cls.cluster.start()
        except Exception:
            cls.cluster.stop()
            raise
        cls.agents = AgentThread()
        cls.loop = asyncio.new_event_loop()
        cls.tenant = cls.cluster.tenant()
        cls.http = Http(cls.cluster)
        cls.policy = PcrPolicy.from_dict(
            {"pcrs": {str(PCR): [cls.cluster.good_pcr_hex()]}}
        )
        for node in cls.cluster.nodes:
            if not wait_until(lambda n=node: cls._registered(n.uuid), 60):
                raise RuntimeError(f"agent {node.index} never registered")

    @classmethod
    def tearDownClass(cls) -> None:
        try:
            cls.loop.run_until_complete(cls.tenant.close())
            cls.loop.close()
            cls.agents.stop()
        finally:
            cls.cluster.stop()
            shutil.rmtree(cls.tmp, ignore_errors=True)
            super().tearDownClass()

    @classmethod
    def _registered(cls, uuid: str) -> bool:
        r = Http(cls.cluster).call(
            "GET", f"{cls.cluster.registrar_url}/v1/agents/{uuid}"
        )
        return r.status_code == 200 and r.json()["activated"] is True

    # -- helpers ------------------------------------------------------------

    def arun(self, coro):  # type: ignore[no-untyped-def]
        return self.loop.run_until_complete(coro)

    def node_state(self, uuid: str) -> dict:  # type: ignore[type-arg]
        r = self.http.call("GET", f"{self.cluster.verifier_url}/v1/nodes/{uuid}")
        self.assertEqual(200, r.status_code, r.text)
        return dict(r.json())

    def wait_state(self, uuid: str, state: str, timeout: float) -> dict:  # type: ignore[type-arg]
        wait_until(lambda: self.node_state(uuid)["state"] == state, timeout)
        return self.node_state(uuid)

    def evil_agent(self, **kw):  # type: ignore[no-untyped-def]
        tpm = EvilTpm(self.cluster.localca, expected_pcr(GOLDEN_MEASUREMENT))
        workdir = tempfile.mkdtemp(dir=self.tmp)
        return self.agents.start_agent(self.cluster, tpm, workdir, **kw)

    def assert_revoked_by_attack(self, attack: str, reason: str) -> None:
        handle = self.evil_agent()
        uuid = handle.agent.uuid
        self.arun(self.tenant.enrol(uuid, PAYLOAD, self.policy))
        self.wait_state(uuid, "attested", 10)
        handle.tpm.attack = attack
        node = self.wait_state(uuid, "revoked", 4 * INTERVAL + 5)
        self.assertEqual("revoked", node["state"])
        self.assertTrue(
            node["failure_reason"].startswith(reason + ":"), node["failure_reason"]
        )
        events = self.arun(self.tenant.events(uuid))
        self.assertEqual(1, len(events))
        self.assertEqual(reason, events[0]["signed_event"]["event"]["reason"])
        delivered = wait_until(
            lambda: any(r["node_uuid"] == uuid for r in self.cluster.hook_records()), 10
        )
        self.assertTrue(delivered, "revocation hook did not fire")

    # -- the real path on swtpm -------------------------------------------

    def test_bootstrap_then_tampering_revokes_only_that_node(self) -> None:
        nodes = self.cluster.nodes
        for node in nodes:
            self.arun(self.tenant.enrol(node.uuid, PAYLOAD, self.policy))
        for node in nodes:
            status = wait_until(node.payload_status, 20)
            self.assertEqual({"exit_code": 0}, status)
            self.assertEqual(f"payload ran on {node.uuid}\n", node.payload_output())
            self.assertEqual("attested", self.node_state(node.uuid)["state"])
            with open(os.path.join(node.work_dir, "identity.pem"), "rb") as f:
                cert = x509.load_pem_x509_certificate(f.read())
            self.assertIn(node.uuid, cert.subject.rfc4514_string())
        victim = nodes[1]
        self.cluster.tamper(victim)
        tampered = time.monotonic()
        state = self.wait_state(victim.uuid, "revoked", 2 * INTERVAL + 3)
        self.assertEqual("revoked", state["state"])
        self.assertLess(time.monotonic() - tampered, 2 * INTERVAL + 3)
        self.assertIn("pcr_policy", state["failure_reason"])
        records = wait_until(self.cluster.hook_records, 10)
        self.assertIn(victim.uuid, [r["node_uuid"] for r in records])
        time.sleep(2 * INTERVAL)
        for node in (nodes[0], nodes[2]):
            self.assertEqual("attested", self.node_state(node.uuid)["state"])

    # -- attacks through the running verifier -----------------------------

    def test_replayed_quote_revokes_node(self) -> None:
        self.assert_revoked_by_attack("replay", "nonce_mismatch")

    def test_quote_signed_by_another_ak_revokes_node(self) -> None:
        self.assert_revoked_by_attack("foreign_ak", "signature_invalid")

    def test_clock_rollback_revokes_node(self) -> None:
        self.assert_revoked_by_attack("clock_rollback", "clock_rollback")

    def test_pcr_values_not_matching_signed_digest_revoke_node(self) -> None:
        self.assert_revoked_by_attack("lie_pcrs", "pcr_digest_mismatch")

    def test_ak_never_activated_cannot_be_enrolled(self) -> None:
        handle = self.evil_agent(activate=False)
        uuid = handle.agent.uuid

        async def register_only() -> None:  # registration without activation
            agent = handle.agent
            body = {
                "ek_public": base64.b64encode(handle.tpm.ek_public()).decode(),
                "ek_certificate": base64.b64encode(handle.tpm.ek_cert).decode(),
                "ak_public": base64.b64encode(handle.tpm.ak_public()).decode(),
                "tls_cert": agent.tls_cert_pem.decode(),
                "host": "127.0.0.1",
                "port": handle.port,
            }
            r = Http(self.cluster, "agent").call(
                "POST", f"{self.cluster.registrar_url}/v1/agents/{uuid}", json=body
            )
            self.assertEqual(200, r.status_code, r.text)

        self.agents.run(register_only())
        e = self.assertRaises(
            ServiceError, self.arun, self.tenant.enrol(uuid, PAYLOAD, self.policy)
        )
        # a registration whose AK was never activated is not in force
        self.assertIn("is not registered", str(e))
        r = self.http.call(
            "POST",
            f"{self.cluster.verifier_url}/v1/nodes",
            json={
                "uuid": uuid,
                "v": base64.b64encode(bytes(32)).decode(),
                "u_commitment": base64.b64encode(bytes(32)).decode(),
                "policy": self.policy.to_dict(),
            },
        )
        # nothing is in force at the registrar until the AK is activated
        self.assertEqual(404, r.status_code, r.text)
        self.assertEqual("unknown_node", r.json()["error"]["code"])
        self.assertEqual(
            404,
            self.http.call(
                "GET", f"{self.cluster.verifier_url}/v1/nodes/{uuid}"
            ).status_code,
        )

    def test_ek_certificate_from_another_ca_is_refused(self) -> None:
        foreign = make_foreign_ca(os.path.join(self.tmp, "foreign-ca"))
        tpm = EvilTpm(foreign, expected_pcr(GOLDEN_MEASUREMENT))
        workdir = tempfile.mkdtemp(dir=self.tmp)
        handle = self.agents.start_agent(self.cluster, tpm, workdir, activate=False)
        from node_agent.exceptions import RegistrationError

        e = self.assertRaises(
            RegistrationError, self.agents.run, handle.agent.register()
        )
        self.assertIn("ek_certificate", str(e))
        r = self.http.call(
            "GET", f"{self.cluster.registrar_url}/v1/agents/{handle.agent.uuid}"
        )
        self.assertEqual(404, r.status_code)

    def test_wrong_registration_credential_is_refused(self) -> None:
        handle = self.evil_agent(activate=False)
        uuid = handle.agent.uuid
        body = {
            "ek_public": base64.b64encode(handle.tpm.ek_public()).decode(),
            "ek_certificate": base64.b64encode(handle.tpm.ek_cert).decode(),
            "ak_public": base64.b64encode(handle.tpm.ak_public()).decode(),
            "tls_cert": handle.agent.tls_cert_pem.decode(),
            "host": "127.0.0.1",
            "port": handle.port,
        }
        url = f"{self.cluster.registrar_url}/v1/agents/{uuid}"
        agent_client = Http(self.cluster, "agent")
        self.assertEqual(200, agent_client.call("POST", url, json=body).status_code)
        r = agent_client.call(
            "POST",
            url + "/activate",
            json={"credential": base64.b64encode(bytes(32)).decode()},
        )
        self.assertEqual(403, r.status_code)
        self.assertEqual("activation_failed", r.json()["error"]["code"])
        # Nothing is in force before the AK is activated.
        self.assertEqual(404, self.http.call("GET", url).status_code)

    def test_identity_quote_failing_policy_sends_nothing(self) -> None:
        handle = self.evil_agent()
        bad = PcrPolicy.from_dict({"pcrs": {str(PCR): ["00" * 32]}})
        self.assertRaises(
            AttestationFailedError,
            self.arun,
            self.tenant.enrol(handle.agent.uuid, PAYLOAD, bad),
        )
        self.assertEqual(
            404,
            self.http.call(
                "GET", f"{self.cluster.verifier_url}/v1/nodes/{handle.agent.uuid}"
            ).status_code,
        )
        self.assertFalse(handle.agent.status()["has_u"])

    def test_u_envelope_for_another_node_is_refused_by_agent(self) -> None:
        handle = self.evil_agent()
        agent = handle.agent
        other = str(uuid_mod.uuid4())
        key = generate_key()
        u_share, _ = split(key)
        body = {
            "u": base64.b64encode(
                seal_share(agent.nk_public, u_share, "U", other)
            ).decode(),
            "payload": base64.b64encode(seal_payload(key, b"x", other)).decode(),
        }
        ctx = ssl.create_default_context(cadata=agent.tls_cert_pem.decode())
        ctx.check_hostname = False
        ctx.load_cert_chain(
            self.cluster.pki_file("tenant.pem"), self.cluster.pki_file("tenant-key.pem")
        )
        r = self._post_agent(handle.port, "/v1/keys/u", body, ctx)
        self.assertEqual(400, r[0])
        self.assertEqual("envelope", r[1]["error"]["code"])
        self.assertFalse(agent.status()["has_u"])

    def _post_agent(self, port, path, body, ctx):  # type: ignore[no-untyped-def]
        import aiohttp

        async def post():  # type: ignore[no-untyped-def]
            async with (
                aiohttp.ClientSession() as s,
                s.post(f"https://127.0.0.1:{port}{path}", json=body, ssl=ctx) as resp,
            ):
                return resp.status, await resp.json()

        return self.arun(post())

    # -- bad input and wrong clients ---------------------------------------

    def test_wrong_mtls_client_is_refused_everywhere(self) -> None:
        from verifier.ca import CertificateAuthority

        other = CertificateAuthority.create(os.path.join(self.tmp, "other-ca"), "x")
        key, cert = other.issue("intruder", ["127.0.0.1"])
        kf, cf = (
            os.path.join(self.tmp, "intruder-key.pem"),
            os.path.join(self.tmp, "intruder.pem"),
        )
        with open(kf, "wb") as f:
            f.write(key)
        with open(cf, "wb") as f:
            f.write(cert)
        for url in (
            self.cluster.verifier_url + "/v1/nodes",
            self.cluster.registrar_url + "/v1/agents",
        ):
            for cert in ((cf, kf), None):
                session = requests.Session()
                session.trust_env = False
                session.verify = self.cluster.pki_file("ca.pem")
                session.cert = cert
                if cert is None:
                    # both let callers without a certificate connect (agents
                    # identified by their TPM, load balancers' healthcheck)
                    # but serve them nothing else
                    r = session.get(url, timeout=10)
                    self.assertEqual(401, r.status_code, r.text)
                    continue
                self.assertRaises(
                    requests.exceptions.ConnectionError, session.get, url, timeout=10
                )
            # the same request with the tenant's certificate is served
            self.assertEqual(200, self.http.call("GET", url).status_code)

    def test_bad_input_gets_json_4xx_and_changes_nothing(self) -> None:
        v = self.cluster.verifier_url
        before = self.http.call("GET", f"{v}/v1/nodes").json()
        unknown = str(uuid_mod.uuid4())
        good_v = base64.b64encode(bytes(32)).decode()
        cases = [
            ("POST", f"{v}/v1/nodes", {"data": b"{not json"}, 400, "bad_json"),
            ("POST", f"{v}/v1/nodes", {"json": [1, 2]}, 400, "bad_json"),
            (
                "POST",
                f"{v}/v1/nodes",
                {
                    "json": {
                        "uuid": unknown,
                        "v": "***",
                        "u_commitment": base64.b64encode(bytes(32)).decode(),
                        "policy": self.policy.to_dict(),
                    }
                },
                400,
                "bad_field",
            ),
            (
                "POST",
                f"{v}/v1/nodes",
                {
                    "json": {
                        "uuid": "not-a-uuid",
                        "v": good_v,
                        "u_commitment": base64.b64encode(bytes(32)).decode(),
                        "policy": self.policy.to_dict(),
                    }
                },
                400,
                "malformed",
            ),
            (
                "POST",
                f"{v}/v1/nodes",
                {
                    "json": {
                        "uuid": unknown,
                        "v": good_v,
                        "u_commitment": base64.b64encode(bytes(32)).decode(),
                        "policy": {"pcrs": {"16": ["zz"]}},
                    }
                },
                400,
                "malformed",
            ),
            (
                "POST",
                f"{v}/v1/nodes",
                {
                    "json": {
                        "uuid": unknown,
                        "v": good_v,
                        "u_commitment": base64.b64encode(bytes(32)).decode(),
                        "policy": self.policy.to_dict(),
                    }
                },
                404,
                "unknown_node",
            ),
            ("POST", f"{v}/v1/nodes", {"data": b"x" * 200_000}, 413, "too_large"),
            ("GET", f"{v}/v1/nodes/{unknown}", {}, 404, "unknown_node"),
            ("DELETE", f"{v}/v1/nodes/{unknown}", {}, 404, "unknown_node"),
            (
                "POST",
                f"{self.cluster.registrar_url}/v1/agents/{unknown}",
                {
                    "json": {
                        "ek_public": "!!",
                        "ak_public": "",
                        "tls_cert": "x",
                        "host": "h",
                        "port": 1,
                    }
                },
                400,
                "bad_field",
            ),
            (
                "POST",
                f"{self.cluster.registrar_url}/v1/agents/{unknown}/activate",
                {"json": {"credential": good_v}},
                404,
                "unknown_node",
            ),
        ]
        agent_client = Http(self.cluster, "agent")
        for method, url, kw, status, code in cases:
            client = agent_client if "/v1/agents" in url else self.http
            r = client.call(method, url, **kw)
            self.assertEqual(status, r.status_code, f"{method} {url}: {r.text}")
            self.assertEqual(code, r.json()["error"]["code"], r.text)
        self.assertEqual(before, self.http.call("GET", f"{v}/v1/nodes").json())

    def test_client_outside_the_role_is_forbidden(self) -> None:
        node = self.cluster.nodes[0].uuid
        agent_client = Http(self.cluster, "agent")
        for method, url in (
            ("GET", f"{self.cluster.verifier_url}/v1/nodes"),
            ("DELETE", f"{self.cluster.verifier_url}/v1/nodes/{node}"),
            ("POST", f"{self.cluster.verifier_url}/v1/nodes/{node}/revoke"),
        ):
            r = agent_client.call(method, url)
            self.assertEqual(403, r.status_code, r.text)
            self.assertEqual("forbidden", r.json()["error"]["code"])
        r = self.http.call("DELETE", f"{self.cluster.registrar_url}/v1/agents/{node}")
        self.assertEqual(403, r.status_code, r.text)
        r = self.http.call("GET", f"{self.cluster.registrar_url}/v1/agents/{node}")
        self.assertEqual(200, r.status_code)
        # the agent takes V only from the verifier, U only from the tenant
        record = r.json()
        ctx = ssl.create_default_context(cadata=record["tls_cert"])
        ctx.check_hostname = False
        ctx.load_cert_chain(
            self.cluster.pki_file("tenant.pem"), self.cluster.pki_file("tenant-key.pem")
        )
        status, body = self._post_agent(
            record["port"], "/v1/keys/v", {"v": "AAAA", "identity_cert": None}, ctx
        )
        self.assertEqual(403, status)
        self.assertEqual("forbidden", body["error"]["code"])
