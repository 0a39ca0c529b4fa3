"""The tenant's relay to polled nodes under a real Keystone: a tenant
needs nothing but its token -- no certificate, no route to the node.

``RelayHttpTest``: the verifier's tenant API over HTTP with real tokens of
two projects (:mod:`verifier.tests.functional.tenancy_base`); the node is
the real :class:`node_agent.agent.Agent` on a software TPM behind the
verifier's agent stand-in. One named test per attack on the relay to a
polled node, each refused with nothing kept or forwarded.

``NoCertificateTenantTest``: ``trusted-tenant enrol`` with keystoneauth
options only, against registrar and verifier processes with
``auth_strategy = keystone`` and a ``trusted-agent`` on swtpm that accepts
no tenant certificate: the node passes its identity quote, gets U and V,
and runs its payload.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from typing import Any, ClassVar

from node_agent.agent import Agent, TpmAccess
from node_agent.exceptions import RefusedError
from node_agent.tests.unit.test_agent import SCRIPT, SoftTpmAdapter
from nova_plugin import cmd as tenant_cmd
from trusted_testing.cluster import LocalCluster, wait_until
from trusted_testing.e2e import Http
from trusted_testing.softtpm import SoftTpm
from verifier.exceptions import AgentUnreachableError
from verifier.protocol import (
    AttestationKey,
    EnvelopeError,
    bind_nonce,
    generate_key,
    seal_payload,
    seal_share,
    split,
)
from verifier.protocol.enroller import commit_u
from verifier.protocol.messages.shares import ShareU
from verifier.protocol.relay import check_identity_answer
from verifier.tests.functional.tenancy_base import KeystoneTestBase, unittest

PAYLOAD = b'#!/bin/sh\necho "payload ran on $TRUSTED_NODE_UUID"\n'


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class RelayHttpTest(KeystoneTestBase):
    async def asyncSetUp(self) -> None:
        await super().asyncSetUp()
        self.node = self.new_agent()
        self.nova.add_server(self.node.uuid, self.project_of("alice"))
        self.agent = Agent(
            self.node.uuid,
            TpmAccess(lambda: SoftTpmAdapter(self.node.tpm), shared=True),
            os.path.join(self.tmp, "agent"),
            payload_timeout=10,
        )
        self.node.nk_override = self.agent.nk_public
        self.node.csr_der = self.agent.csr_der
        self.node.take_u = self._agent_takes_u
        self.key = generate_key()
        self.u, v = split(self.key)
        body = self.enrolment(self.node.uuid, v)
        body["u_commitment"] = _b64(commit_u(self.node.uuid, self.u))
        body["policy"] = self.policy.to_dict()
        status, data = await self.call("alice", "POST", "/v1/nodes", body)
        self.assertEqual(201, status, data)
        self.base = f"/v1/nodes/{self.node.uuid}/relay"

    async def _agent_takes_u(self, body: Mapping[str, Any]) -> dict[str, Any]:
        share = ShareU.from_dict(body)
        try:
            done = await self.agent.receive_u(
                share.u, share.payload, share.payload_id, certified=False
            )
        except (RefusedError, EnvelopeError) as exc:
            raise AgentUnreachableError(f"agent answered 403 to /v1/keys/u: {exc}")
        return {"accepted": "u", "bootstrapped": done}

    async def ask(self, who: str, nonce: bytes) -> tuple[int, Any]:
        body = {"nonce": nonce.hex(), "pcrs": [16]}
        return await self.call(who, "POST", f"{self.base}/identity", body)

    async def checked_nk(self) -> bytes:
        """Alice's identity quote through the relay, checked as the tenant."""
        nonce = os.urandom(20)
        status, data = await self.ask("alice", nonce)
        self.assertEqual(202, status, data)
        status, data = await self.call(
            "alice", "GET", f"{self.base}/identity?nonce={nonce.hex()}"
        )
        self.assertEqual((200, "answered"), (status, data["state"]), data)
        ak = AttestationKey(self.node.tpm.ak, True)
        return check_identity_answer(data["answer"], ak, nonce, self.policy)

    def u_body(self, nk: bytes, node: str | None = None) -> dict[str, Any]:
        sealed = seal_payload(self.key, SCRIPT, self.node.uuid)
        u = seal_share(nk, self.u, "U", node or self.node.uuid)
        return ShareU(u, sealed).to_dict()

    async def test_tenant_relays_to_its_polled_node_with_only_a_token(self) -> None:
        nk = await self.checked_nk()
        self.assertEqual(self.agent.nk_public, nk)
        status, data = await self.call(
            "alice", "POST", f"{self.base}/u", self.u_body(nk)
        )
        self.assertEqual((202, "accepted"), (status, data["state"]), data)
        status, data = await self.call("alice", "GET", f"{self.base}/u")
        self.assertEqual((200, "accepted"), (status, data["state"]), data)

    async def test_relay_for_another_projects_polled_node_is_404(self) -> None:
        asked = len(self.node.quote_requests)
        status, data = await self.ask("bob", os.urandom(20))
        self.assertEqual((404, "unknown_node"), (status, data["error"]["code"]))
        self.assertEqual(asked, len(self.node.quote_requests))  # agent not asked
        body = self.u_body(self.agent.nk_public)
        status, data = await self.call("bob", "POST", f"{self.base}/u", body)
        self.assertEqual((404, "unknown_node"), (status, data["error"]["code"]))
        self.assertEqual([], self.node.u_posts)  # nothing forwarded
        status, data = await self.call("bob", "GET", f"{self.base}/u")
        self.assertEqual(404, status, data)

    async def test_polled_quote_not_over_the_tenants_nonce_is_refused(self) -> None:
        replay = self.node.tpm.quote(
            bind_nonce(os.urandom(20), self.agent.nk_public), (16,)
        )
        self.node.answer_hook = lambda a: a.update(quote=replay.to_dict())
        nonce = os.urandom(20)
        status, data = await self.ask("alice", nonce)
        self.assertEqual(
            (502, "identity_not_over_nonce"), (status, data["error"]["code"])
        )
        status, data = await self.call(
            "alice", "GET", f"{self.base}/identity?nonce={nonce.hex()}"
        )
        self.assertEqual((200, "waiting"), (status, data["state"]))  # none kept

    async def test_polled_quote_not_by_the_nodes_ak_is_refused(self) -> None:
        other = SoftTpm(ak_alg="ecc", ek_alg="ecc")

        def forge(answer: dict[str, Any]) -> None:
            nonce = bytes.fromhex(self.node.quote_requests[-1]["nonce"])
            bound = bind_nonce(nonce, self.agent.nk_public)
            answer["quote"] = other.quote(bound, (16,)).to_dict()

        self.node.answer_hook = forge
        status, data = await self.ask("alice", os.urandom(20))
        self.assertEqual(
            (502, "identity_not_over_nonce"), (status, data["error"]["code"])
        )

    async def test_polled_u_for_another_node_is_refused_by_the_agent(self) -> None:
        nk = await self.checked_nk()
        body = self.u_body(nk, self.new_agent().uuid)
        status, data = await self.call("alice", "POST", f"{self.base}/u", body)
        self.assertEqual((202, "refused"), (status, data["state"]), data)
        self.assertIn("does not authenticate", data["detail"])
        self.assertFalse(self.agent.bootstrapped)

    async def test_polled_u_posted_twice_is_409(self) -> None:
        nk = await self.checked_nk()
        body = self.u_body(nk)
        status, data = await self.call("alice", "POST", f"{self.base}/u", body)
        self.assertEqual(202, status, data)
        status, data = await self.call("alice", "POST", f"{self.base}/u", body)
        self.assertEqual((409, "u_already_posted"), (status, data["error"]["code"]))
        self.assertEqual(1, len(self.node.u_posts))  # the agent got it once


class NoCertificateTenantTest(KeystoneTestBase):
    """Registrar and verifier processes behind the test's Keystone."""

    cluster: ClassVar[LocalCluster]
    workdir: ClassVar[str]

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.workdir = tempfile.mkdtemp(prefix="trusted-relay-")
        authtoken = cls.keystone.authtoken_options()
        cls.cluster = LocalCluster(
            os.path.join(cls.workdir, "cluster"),
            nodes=1,
            interval=0.5,
            verifier_options={"auth_strategy": "keystone"},
            verifier_sections={"keystone_authtoken": authtoken},
            registrar_options={"auth_strategy": "keystone"},
            registrar_sections={"keystone_authtoken": authtoken},
        )
        try:
            cls.cluster.start_services()
            node = cls.cluster.nodes[0]
            node.agent_options = {"tenant_clients": "nobody"}  # no tenant cert
            cls.nova.add_server(node.uuid, cls.users["alice"].project_id)
            cls.cluster.start_agent(node)
        except BaseException:
            cls.cluster.stop()
            shutil.rmtree(cls.workdir, ignore_errors=True)
            raise

    @classmethod
    def tearDownClass(cls) -> None:
        try:
            cls.cluster.stop()
        finally:
            shutil.rmtree(cls.workdir, ignore_errors=True)
            super().tearDownClass()

    def tenant_cli(self, who: str, *argv: str) -> tuple[int, str, str]:
        """``trusted-tenant`` as ``who``, with keystoneauth options only."""
        user = self.users[who]
        ca = self.cluster.pki_file("ca.pem")
        full = [
            "--os-auth-type", "password", "--os-auth-url", self.keystone.url,
            "--os-username", user.name, "--os-password", user.password,
            "--os-project-name", user.project_name,
            "--os-user-domain-id", "default", "--os-project-domain-id", "default",
            "--os-cacert", ca, "--ca", ca,
            "--registrar", self.cluster.registrar_url,
            "--json", *argv,
        ]  # fmt: skip
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = tenant_cmd.main(full)
        return code, out.getvalue(), err.getvalue()

    async def test_trusted_tenant_enrols_a_polled_node_with_no_certificate(
        self,
    ) -> None:
        node = self.cluster.nodes[0]
        service = await asyncio.to_thread(
            self.keystone.add_service,
            "attestation",
            "trusted-cloud",
            self.cluster.verifier_url,
        )
        self.addCleanup(self.keystone.delete_service, service)
        registered = await asyncio.to_thread(
            wait_until, lambda: self._activated(node.uuid), 60
        )
        self.assertTrue(registered, "the agent never registered")
        for name in ("TRUSTED_CERT", "TRUSTED_KEY", "TRUSTED_VERIFIER_URL"):
            self.assertNotIn(name, os.environ)
        payload = os.path.join(self.tmp, "payload.sh")
        with open(payload, "wb") as f:
            f.write(PAYLOAD)
        code, out, err = await asyncio.to_thread(
            self.tenant_cli,
            "alice",
            "enrol",
            node.uuid,
            "--payload",
            payload,
            "--pcr",
            f"16={self.cluster.good_pcr_hex()}",
        )
        self.assertEqual(0, code, err)
        self.assertIn("passed its identity quote", json.loads(out)["message"])
        ran = await asyncio.to_thread(wait_until, node.payload_status, 30)
        self.assertEqual({"exit_code": 0}, ran)
        self.assertEqual(f"payload ran on {node.uuid}\n", node.payload_output())
        code, out, err = await asyncio.to_thread(
            self.tenant_cli, "alice", "status", node.uuid
        )
        self.assertEqual(0, code, err)
        self.assertEqual("pull", json.loads(out)["mode"])
        # another project sees nothing of it
        code, out, err = await asyncio.to_thread(
            self.tenant_cli, "bob", "status", node.uuid
        )
        self.assertEqual(1, code, out)
        self.assertIn("404", err)
        self.assertNotIn("Traceback", err)

    def _activated(self, uuid: str) -> bool:
        r = Http(self.cluster).call(
            "GET", f"{self.cluster.registrar_url}/v1/agents/{uuid}"
        )
        return r.status_code == 200 and r.json()["activated"] is True


if __name__ == "__main__":
    unittest.main()
