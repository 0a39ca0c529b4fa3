"""Quotas from Keystone's unified limits (oslo.limit) against a real
Keystone: ``[quota] source = keystone``.

Keystone holds registered limits (every project's default) and one
project limit for the service's endpoint; the verifier's service user
reads them system-scoped with the ``reader`` role, as oslo.limit
documents. A resource Keystone has no registered limit for keeps the
configured default. Each refusal is ``403 quota_exceeded`` and stores
nothing.
"""

from __future__ import annotations

import os
import uuid as uuid_mod
from typing import Any, ClassVar

from verifier.attest.keystone_limits import KeystoneLimits
from verifier.attest.quotas import Quotas
from verifier.tests.functional.tenancy_base import KeystoneTestBase, unittest


class KeystoneLimitsTest(KeystoneTestBase):
    service_id: ClassVar[str]
    limits: ClassVar[KeystoneLimits]

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        ks = cls.keystone
        # its own service type: the catalog's "attestation" stays the
        # verifier's own for the other tests of this process
        cls.service_id = ks.add_service(
            "attestation-quota", "limits", "http://127.0.0.1:9/limits"
        )
        ks.grant_system_role(cls.users["attestation"].user_id, "reader")
        ks.set_limit(cls.service_id, "nodes", 2)
        ks.set_limit(cls.service_id, "nodes", 1, cls.users["bob"].project_id)
        ks.set_limit(cls.service_id, "policies", 1)
        path = os.path.join(cls._tmp.name, "limits.conf")
        with open(path, "w") as f:
            f.write(
                "[oslo_limit]\n"
                f"auth_url = {ks.url}\nauth_type = password\n"
                "username = attestation\npassword = attestation-secret\n"
                "user_domain_id = default\nsystem_scope = all\n"
                f"endpoint_id = {ks.endpoint_id(cls.service_id)}\n"
            )
        from oslo_limit import limit

        limit._SDK_CONNECTION = None  # a connection of this configuration
        cls.limits = KeystoneLimits([path])

    @classmethod
    def tearDownClass(cls) -> None:
        from oslo_config import cfg
        from oslo_limit import limit

        limit._SDK_CONNECTION = None
        cfg.CONF.reset()
        cfg.CONF.clear()
        super().tearDownClass()

    def new_verifier(self, notifiers: Any = None) -> Any:
        verifier = super().new_verifier(notifiers)
        quotas = Quotas(nodes=100, policies=100, policy_bytes=64, source=self.limits)
        verifier.store._quotas = quotas
        verifier.policies._quotas = quotas
        return verifier

    async def enrol_refused(self, who: str) -> dict[str, Any]:
        agent = self.new_agent()
        self.nova.add_server(agent.uuid, self.project_of(who))
        status, answer = await self.call(
            who, "POST", "/v1/nodes", self.enrolment(agent.uuid)
        )
        self.assertEqual((403, "quota_exceeded"), (status, answer["error"]["code"]))
        self.assertIsNone(self.row(agent.uuid))
        return dict(answer["error"])

    async def test_registered_limit_applies_to_every_project(self) -> None:
        await self.enrol_node("alice")
        await self.enrol_node("alice")
        error = await self.enrol_refused("alice")
        self.assertIn("quota of 2 nodes", error["message"])

    async def test_project_limit_overrides_the_registered_one(self) -> None:
        await self.enrol_node("bob")
        error = await self.enrol_refused("bob")
        self.assertIn("quota of 1 nodes", error["message"])
        await self.enrol_node("alice")  # alpha still has its default of 2

    async def test_resource_without_a_registered_limit_keeps_the_default(
        self,
    ) -> None:
        add = {"policy": {"secure_boot": True}, "name": "a"}
        status, _ = await self.call("bob", "POST", "/v1/policies/measured-boot", add)
        self.assertEqual(201, status)
        add["name"] = "b"  # Keystone: 1 policy per project
        status, answer = await self.call(
            "bob", "POST", "/v1/policies/measured-boot", add
        )
        self.assertEqual((403, "quota_exceeded"), (status, answer["error"]["code"]))
        # policy_bytes: no registered limit, the configured 64 bytes apply
        big = {"policy": {"firmware": ["aa" * 32]}, "name": "big"}
        status, answer = await self.call(
            "alice", "POST", "/v1/policies/measured-boot", big
        )
        self.assertEqual((403, "quota_exceeded"), (status, answer["error"]["code"]))
        self.assertIn("policy bytes", answer["error"]["message"])
        self.assertIsNone(self.limits(self.project_of("alice"), "policy_bytes"))

    async def test_limit_changed_in_keystone_applies_at_once(self) -> None:
        project = self.keystone.add_project(f"gamma-{uuid_mod.uuid4().hex[:8]}")
        self.assertEqual(1, self.limits(project, "policies"))  # registered
        self.keystone.set_limit(self.service_id, "policies", 3, project)
        self.assertEqual(3, self.limits(project, "policies"))  # no restart
        self.assertEqual(2, self.limits(project, "nodes"))


if __name__ == "__main__":
    unittest.main()
