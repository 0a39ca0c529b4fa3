"""``openstack attestation host ...`` and ``/v1/hosts`` against a real
Keystone: the ``attestation`` service user enrols, lists, shows and
deletes a compute host through the ``openstack`` CLI; a project member is
refused (403) by the API and the CLI; bad arguments are usage errors
(exit status 2, one line, no traceback)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from verifier.tests.functional.tenancy_base import KeystoneTestBase

_OPENSTACK = os.path.join(os.path.dirname(sys.executable), "openstack")


class OpenStackHostCliTest(KeystoneTestBase):
    async def asyncSetUp(self) -> None:
        await super().asyncSetUp()
        url = str(self.server.make_url("")).rstrip("/")
        service = await asyncio.to_thread(
            self.keystone.add_service, "attestation", "trusted-cloud", url
        )
        self.addCleanup(self.keystone.delete_service, service)

    async def openstack(self, who: str, *argv: str) -> tuple[int, str, str]:
        user = self.users[who]
        env = dict(
            os.environ,
            OS_AUTH_URL=self.keystone.url,
            OS_USERNAME=user.name,
            OS_PASSWORD=user.password,
            OS_PROJECT_NAME=user.project_name,
            OS_USER_DOMAIN_ID="default",
            OS_PROJECT_DOMAIN_ID="default",
            OS_IDENTITY_API_VERSION="3",
            OS_INTERFACE="public",
        )
        env.pop("OS_CLOUD", None)
        proc = await asyncio.create_subprocess_exec(
            _OPENSTACK, "attestation", "host", *argv,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await proc.communicate()
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode()

    async def json_of(self, who: str, *argv: str) -> Any:
        code, out, err = await self.openstack(who, *argv, "-f", "json")
        self.assertEqual(0, code, err)
        return json.loads(out)

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
