"""Policy-sealed data under a real Keystone: each node's CP-ABE key names
its owning project, and a tenant seals to its own project, so a node of
another project with the very same configuration cannot open the payload.

Why (issue 17): keys were cached per attribute set and shared by every
node of that configuration, whoever owned it; a payload sealed by one
project to ``region=eu`` opened on every other project's ``region=eu``
node. Each refusal below leaves the sealed payload closed to that node.
"""

from __future__ import annotations

import json
import os
import types
from typing import Any

from aiohttp.test_utils import TestServer

from node_agent.abe import AbeKeyring
from node_agent.agent import Agent
from node_agent.exceptions import RefusedError
from nova_plugin.policy_seal import seal_to_policy
from trusted_testing.softtpm import SoftTpm
from verifier.api.abe_app import add_abe_routes
from verifier.api.verifier_app import make_app
from verifier.attest.abe_keys import AbeAuthority, ProviderAttributes
from verifier.common.tpm_access import TpmAccess
from verifier.protocol import MalformedError
from verifier.protocol.messages.abe import AbeParams
from verifier.tests.functional.tenancy_base import KeystoneTestBase, unittest

DIGEST = bytes(range(32))
SAME = {"region": "eu", "hv": "kvm-9"}


class PolicySealingTenancyTest(KeystoneTestBase):
    async def asyncSetUp(self) -> None:
        await super().asyncSetUp()
        self.alpha = await self.enrol_node("alice")
        self.beta = await self.enrol_node("bob")
        attributes = os.path.join(self.tmp, "provider.json")
        with open(attributes, "w", encoding="utf-8") as f:
            json.dump({self.alpha.uuid: SAME, self.beta.uuid: SAME}, f)
        self.authority = AbeAuthority(
            os.path.join(self.tmp, "abe", "master.key"),
            ProviderAttributes(attributes),
            agents=None,  # type: ignore[arg-type]
        )
        app = make_app(
            self.verifier, "PEM", self.auth,
            routes=[lambda a: add_abe_routes(a, self.authority)],
        )  # fmt: skip
        self.abe_server = TestServer(app, host="127.0.0.1")
        await self.abe_server.start_server()

    async def asyncTearDown(self) -> None:
        await self.abe_server.close()
        await super().asyncTearDown()

    async def params(self, who: str) -> AbeParams:
        url = str(self.abe_server.make_url("/v1/abe/params"))
        headers = {"X-Auth-Token": self.tokens[who]}
        async with self.http.get(url, headers=headers) as resp:
            self.assertEqual(200, resp.status)
            return AbeParams.from_dict(await resp.json())

    def keyring_of(self, uuid: str) -> AbeKeyring:
        """The node's agent holding the key the verifier issues it after a
        valid quote (sealed to its NK, as delivered)."""
        work = os.path.join(self.tmp, f"agent-{uuid}")
        os.makedirs(work, exist_ok=True)
        agent = Agent(uuid, TpmAccess(SoftTpm), work)
        attest: Any = types.SimpleNamespace(pcr_digest=DIGEST)
        owed = self.authority.owed(
            self.verifier.nodes.live(uuid), attest, agent.nk_public
        )
        assert owed is not None
        delivery, _ = owed
        keyring = AbeKeyring(agent)
        keyring.receive(delivery.key, delivery.params, delivery.epoch)
        return keyring

    async def test_params_name_the_callers_project(self) -> None:
        self.assertEqual(self.project_of("alice"), (await self.params("alice")).project)
        self.assertEqual(self.project_of("bob"), (await self.params("bob")).project)

    async def test_node_of_other_project_cannot_open_a_sealed_payload(self) -> None:
        blob = seal_to_policy(await self.params("alice"), "region=eu", b"alpha only")
        self.assertEqual(b"alpha only", self.keyring_of(self.alpha.uuid).open(blob))
        beta = self.keyring_of(self.beta.uuid)
        with self.assertRaises(RefusedError) as ctx:
            beta.open(blob)
        self.assertEqual(
            ("policy_not_satisfied", 403), (ctx.exception.code, ctx.exception.status)
        )
        # one configuration, two projects: two keys (no shared cache entry)
        self.assertEqual(2, self.authority.keygens)

    async def test_tenant_cannot_seal_to_another_projects_nodes(self) -> None:
        params = await self.params("bob")
        beta_project = self.project_of("bob")
        for policy in (f"region=eu and project={self.project_of('alice')}",
                       "region=eu or project=x", "epoch=0"):  # fmt: skip
            with self.assertRaises(MalformedError):
                seal_to_policy(params, policy, b"x")
        forged = AbeParams(params.params, params.epoch, self.project_of("alice"))
        blob = seal_to_policy(forged, "region=eu", b"forged")
        # bob's own node still cannot open what names alpha's project
        with self.assertRaises(RefusedError):
            self.keyring_of(self.beta.uuid).open(blob)
        self.assertEqual(beta_project, params.project)

    async def test_node_without_a_project_gets_no_key(self) -> None:
        node = self.verifier.nodes.live(self.alpha.uuid)
        orphan: Any = types.SimpleNamespace(uuid=node.uuid, project_id="")
        attest: Any = types.SimpleNamespace(pcr_digest=DIGEST)
        self.assertIsNone(self.authority.owed(orphan, attest, b"nk"))


if __name__ == "__main__":
    unittest.main()
