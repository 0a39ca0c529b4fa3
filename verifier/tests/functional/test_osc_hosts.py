"""``openstack attestation host ...`` and ``/v1/hosts`` against a real
Keystone: the ``attestation`` service user enrols, lists, shows and
deletes a compute host through the ``openstack`` CLI; a project member is
refused (403) by the API and the CLI; bad arguments are usage errors
(exit status 2, one line, no traceback)."""

from __future__ import annotations

import json
import os

from verifier.tests.functional.tenancy_base import OpenStackCliCase


class OpenStackHostCliTest(OpenStackCliCase):
    command = ("attestation", "host")

    async def test_service_user_manages_hosts_and_a_member_is_refused(self) -> None:
        agent = self.new_agent()
        enrol = ("enrol", "--provider", agent.uuid, "--hypervisor", "compute-1")
        pcr = os.path.join(self.tmp, "pcr.json")
        with open(pcr, "w") as f:
            json.dump(self.policy.to_dict(), f)
        code, _, err = await self.openstack("alice", *enrol, "--pcr-policy", pcr)
        self.assertEqual(1, code)
        self.assertIn("forbidden", err)
        self.assertNotIn("Traceback", err)
        created = await self.json_of("attestation", *enrol, "--pcr-policy", pcr)
        self.assertEqual(
            ("compute-1", "registered"),
            (created["hypervisor_hostname"], created["state"]),
        )
        await self.verifier.rounds.attest_once(agent.uuid)
        listed = await self.json_of("attestation", "list")
        self.assertEqual(
            [("compute-1", "attested", True)],
            [(h["hypervisor_hostname"], h["state"], h["trusted"]) for h in listed],
        )
        shown = await self.json_of("attestation", "show", "compute-1")
        self.assertEqual((agent.uuid, []), (shown["provider"], shown["guests"]))
        code, _, err = await self.openstack("attestation", *enrol, "--pcr-policy", pcr)
        self.assertEqual((1, True), (code, "provider_claimed" in err))
        for who in ("alice", "rita", "bob"):
            status, body = await self.call(who, "GET", "/v1/hosts")
            self.assertEqual(403, status, body)
        status, body = await self.call("admin", "GET", "/v1/hosts/compute-1")
        self.assertEqual((200, "compute-1"), (status, body["hypervisor_hostname"]))
        code, _, err = await self.openstack("attestation", "delete", "compute-1")
        self.assertEqual(0, code, err)
        self.assertEqual([], await self.json_of("attestation", "list"))

    async def test_bad_arguments_are_usage_errors(self) -> None:
        for argv in (
            ("enrol", "--provider", "not-a-uuid", "--hypervisor", "c1",
             "--pcr-policy", "/nonexistent.json"),
            ("enrol", "--provider", "7d7ac7b4-0c5a-4d0e-9c57-4f4b0a0c0b0a",
             "--hypervisor", "a b", "--mb-policy", "fw"),
            ("enrol", "--provider", "7d7ac7b4-0c5a-4d0e-9c57-4f4b0a0c0b0a",
             "--hypervisor", "c1"),
        ):  # fmt: skip
            with self.subTest(argv=argv):
                code, _, err = await self.openstack("attestation", *argv)
                self.assertEqual(2, code, err)
                self.assertNotIn("Traceback", err)
