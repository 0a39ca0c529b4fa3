"""``openstack attestation node|policy ...`` against a real Keystone.

The ``openstack`` CLI (python-openstackclient with our plugin) runs as a
child process with a user's password credentials; it finds the verifier in
the Keystone catalog (service type ``attestation``) and uses its own
keystoneauth session: no tenant certificate anywhere.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid as uuid_mod

from keystoneauth1 import session as ks_session
from keystoneauth1.identity import v3

from nova_plugin.attestation import AttestationClient
from nova_plugin.exceptions import ServiceError
from nova_plugin.tenant import Tenant, TenantConfig
from verifier.protocol import PcrPolicy
from verifier.tests.functional.tenancy_base import KeystoneTestBase, OpenStackCliCase


class OpenStackCliTest(OpenStackCliCase):
    async def test_node_and_policy_commands_are_scoped_to_the_project(self) -> None:
        path = os.path.join(self.tmp, "mb.json")
        with open(path, "w") as f:
            json.dump({"secure_boot": True}, f)
        created = await self.json_of(
            "alice", "policy", "create", "--kind", "measured-boot",
            "--name", "golden", path,
        )  # fmt: skip
        self.assertEqual(("golden", 1), (created["name"], created["version"]))
        listed = await self.json_of(
            "alice", "policy", "list", "--kind", "measured-boot"
        )
        self.assertEqual(["golden"], [p["name"] for p in listed])
        shown = await self.json_of(
            "alice", "policy", "show", "--kind", "measured-boot", "golden"
        )
        self.assertEqual(
            {"secure_boot": True}, {"secure_boot": shown["policy"]["secure_boot"]}
        )
        self.assertEqual(
            [], await self.json_of("bob", "policy", "list", "--kind", "measured-boot")
        )

        uuid = (await self.enrol_node("alice")).uuid
        nodes = await self.json_of("alice", "node", "list")
        self.assertEqual([uuid], [n["uuid"] for n in nodes])
        self.assertEqual([], await self.json_of("bob", "node", "list"))

        code, out, err = await self.openstack("bob", "node", "show", uuid)
        self.assertEqual(1, code)
        self.assertIn("unknown_node", err)
        self.assertNotIn("Traceback", err)
        code, _, err = await self.openstack("bob", "node", "revoke", uuid)
        self.assertEqual((1, True), (code, "unknown_node" in err))

        node = await self.json_of(
            "alice", "node", "revoke", uuid, "--detail", "decommissioned"
        )
        self.assertEqual("revoked", node["state"])
        events = await self.json_of("alice", "node", "events")
        self.assertEqual(
            [(uuid, "tenant_revoked")], [(e["node_uuid"], e["reason"]) for e in events]
        )
        self.assertEqual([], await self.json_of("bob", "node", "events"))
        # the same, filtered, under its new name
        events = await self.json_of(
            "alice", "event", "list", "--node", uuid, "--since", "1h",
            "--kind", "revoked", "--all",
        )  # fmt: skip
        self.assertEqual(
            [(uuid, "revoked", "tenant_revoked", "decommissioned")],
            [(e["node_uuid"], e["kind"], e["reason"], e["detail"]) for e in events],
        )
        none = await self.json_of("alice", "event", "list", "--kind", "unreachable")
        self.assertEqual([], none)
        code, _, err = await self.openstack("alice", "event", "list", "--since", "soon")
        self.assertEqual(2, code, err)
        self.assertIn("--since", err)
        self.assertNotIn("Traceback", err)

        code, _, err = await self.openstack("alice", "node", "delete", uuid)
        self.assertEqual(0, code, err)
        code, _, err = await self.openstack(
            "alice", "policy", "delete", "--kind", "measured-boot", "golden"
        )
        self.assertEqual(0, code, err)
        self.assertEqual([], await self.json_of("alice", "node", "list"))

    async def test_value_and_table_formats_and_bad_input(self) -> None:
        uuid = (await self.enrol_node("alice")).uuid
        code, out, err = await self.openstack(
            "alice", "node", "list", "-f", "value", "-c", "uuid"
        )
        self.assertEqual((0, uuid), (code, out.strip()), err)
        code, out, err = await self.openstack(
            "alice", "node", "show", uuid, "-f", "table"
        )
        self.assertEqual(0, code, err)
        self.assertIn("| uuid", out)
        self.assertIn(uuid, out)
        code, out, err = await self.openstack(
            "alice", "node", "show", uuid, "-f", "value", "-c", "state"
        )
        self.assertEqual((0, "registered"), (code, out.strip()), err)
        code, out, err = await self.openstack("bob", "node", "list", "-f", "value")
        self.assertEqual((0, ""), (code, out.strip()), err)
        code, out, err = await self.openstack(
            "alice", "policy", "list", "--kind", "measured-boot", "-f", "table"
        )
        self.assertEqual(0, code, err)
        # bad input: a usage error on one line, exit 2, nothing changed
        code, _, err = await self.openstack(
            "alice", "policy", "list", "--kind", "bogus"
        )
        self.assertEqual(2, code)
        self.assertNotIn("Traceback", err)
        code, _, err = await self.openstack("rita", "node", "revoke", uuid)
        self.assertEqual((1, True), (code, "forbidden" in err), err)
        self.assertEqual(
            "registered", (await self.json_of("alice", "node", "show", uuid))["state"]
        )

    async def test_node_set_changes_the_policy_in_force(self) -> None:
        path = os.path.join(self.tmp, "mb.json")
        with open(path, "w") as f:
            json.dump({"secure_boot": True}, f)
        for _ in range(2):  # golden versions 1 and 2 (other content)
            await self.json_of(
                "alice", "policy", "create", "--kind", "measured-boot",
                "--name", "golden", path,
            )  # fmt: skip
            with open(path, "w") as f:
                json.dump({"secure_boot": False}, f)
        uuid = (await self.enrol_node("alice")).uuid
        node = await self.json_of(
            "alice", "node", "set", uuid, "--mb-policy", "golden@1"
        )
        self.assertEqual("golden@1 (pinned)", node["mb_policy_in_force"])
        node = await self.json_of("alice", "node", "set", uuid, "--mb-policy", "golden")
        self.assertEqual("golden@2 (follows golden)", node["mb_policy_in_force"])
        listed = await self.json_of("alice", "node", "list")
        self.assertEqual(
            ["golden@2 (follows golden)"], [n["mb_policy_in_force"] for n in listed]
        )
        # refused: one line, nothing changed
        code, _, err = await self.openstack(
            "bob", "node", "set", uuid, "--mb-policy", "golden"
        )
        self.assertEqual((1, True), (code, "unknown_node" in err), err)
        code, _, err = await self.openstack(
            "alice", "node", "set", uuid, "--mb-policy", "golden@7"
        )
        self.assertEqual((1, True), (code, "golden@7" in err), err)
        self.assertNotIn("Traceback", err)
        code, _, err = await self.openstack("alice", "node", "set", uuid)
        self.assertEqual(1, code)
        self.assertNotIn("Traceback", err)
        shown = await self.json_of("alice", "node", "show", uuid)
        self.assertEqual("golden@2 (follows golden)", shown["mb_policy_in_force"])


class TenantLibraryKeystoneTest(KeystoneTestBase):
    """The tenant library (what ``trusted-nova boot`` enrols with) calls the
    verifier on the user's keystoneauth session, found in the catalog."""

    async def asyncSetUp(self) -> None:
        await super().asyncSetUp()
        url = str(self.server.make_url("")).rstrip("/")
        service = await asyncio.to_thread(
            self.keystone.add_service, "attestation", "trusted-cloud", url
        )
        self.addCleanup(self.keystone.delete_service, service)

    def tenant(self, who: str) -> Tenant:
        user = self.users[who]
        auth = v3.Password(
            auth_url=self.keystone.url,
            username=user.name,
            password=user.password,
            project_name=user.project_name,
            user_domain_id="default",
            project_domain_id="default",
        )
        client = AttestationClient(ks_session.Session(auth=auth))
        config = TenantConfig("https://registrar.invalid", "keystone:attestation",
                              None, None, None)  # type: ignore[arg-type]  # fmt: skip
        return Tenant(config, client)

    async def test_enrol_ahead_without_certificate(self) -> None:
        uuid = str(uuid_mod.uuid4())
        self.nova.add_server(uuid, self.users["alice"].project_id)
        alice, bob = self.tenant("alice"), self.tenant("bob")
        try:
            view = await alice.enrol_ahead(
                uuid,
                b"\x05" * 32,
                PcrPolicy({16: frozenset({bytes(32)})}),
                bytes(32),
            )
            self.assertEqual("pending", view["state"])
            self.assertEqual(
                self.users["alice"].project_id, (await alice.status(uuid))["project_id"]
            )
            with self.assertRaises(ServiceError) as caught:
                await bob.status(uuid)
            self.assertEqual(
                (404, "unknown_node"), (caught.exception.status, caught.exception.code)
            )
            self.assertEqual([], await bob.nodes())
        finally:
            await alice.close()
            await bob.close()
