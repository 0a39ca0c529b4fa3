"""The verifier's runtime-evidence loop: IMA lists checked incrementally
against a shared stored policy, firmware logs once per boot, lists sent in
parts, reboots, and every failure revoking the node with the entry named.

Fake agents answer with real quotes of a SoftTpm whose PCRs a
:class:`SoftKernel` extends exactly as firmware and kernel would.
"""

from __future__ import annotations

import base64
import os
import uuid
from collections.abc import Mapping
from typing import Any

from trusted_testing.softkernel import SoftKernel
from verifier.attest.service import Verifier
from verifier.exceptions import ConflictError, NotFoundError, RequestError
from verifier.protocol import PcrPolicy
from verifier.protocol.ima import parse_ascii, policy_from_log
from verifier.tests.unit.test_attest_service import FakeAgent, VerifierServiceBase


class KernelAgent(FakeAgent):
    """A fake agent whose node runs a soft kernel; answers like
    node_agent.evidence (``max_lines`` cuts long lists into parts)."""

    def __init__(self, node_uuid: str, port: int, directory: str) -> None:
        super().__init__(node_uuid, port)
        self.kernel = SoftKernel(
            self.tpm.extend, lambda pcrs: {i: self.tpm.pcrs[i] for i in pcrs}, directory
        )
        self.kernel.boot()
        self.max_lines = 10_000

    def reboot(self, secure_boot: bool = True) -> None:
        self.tpm.pcrs = {i: bytes(32) for i in range(24)}
        self.tpm.reset_count += 1
        self.tpm.extend(16, bytes(32))  # not the golden PCR 16: not used here
        self.kernel.boot(secure_boot)

    async def quote(self, params: Mapping[str, str]) -> dict[str, Any]:
        hook, self.answer_hook = self.answer_hook, None  # run it after ours
        try:
            answer = await super().quote(params)
        finally:
            self.answer_hook = hook
        if "ima_from" in params:
            first = int(params["ima_from"])
            with open(self.kernel.ima_path, encoding="utf-8") as f:
                lines = f.read().splitlines(keepends=True)
            if first > len(lines):
                first = 0
            part = lines[first : first + self.max_lines]
            answer["ima"] = {
                "from": first,
                "format": "ascii",
                "entries": "".join(part),
                "more": first + len(part) < len(lines),
            }
        if params.get("mb") == "1":
            with open(self.kernel.mb_path, "rb") as f:
                answer["mb_log"] = _b64(f.read())
        if hook is not None:
            hook(answer)
        return answer


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class KernelAgentCase(VerifierServiceBase):
    """Helpers for tests on :class:`KernelAgent` nodes, no tests (other
    modules build on it)."""

    def setUp(self) -> None:
        super().setUp()
        self.dirs = iter(range(1000))

    def new_kernel_agent(self) -> KernelAgent:
        directory = os.path.join(self.tmp, f"node{next(self.dirs)}")
        os.makedirs(directory)
        agent = KernelAgent(_uuid(), next(self._ports), directory)
        self.agents.add(agent)
        self.registrar.add(agent)
        return agent

    def good_policy(self, agent: KernelAgent) -> dict[str, Any]:
        """The runtime policy ``golden`` 1: what ``agent`` ran, after it
        ran python3 and sshd."""
        for path, content in (("/usr/bin/python3", b"py"), ("/usr/sbin/sshd", b"ssh")):
            agent.kernel.measure(path, content)
        with open(agent.kernel.ima_path, encoding="utf-8") as f:
            policy = policy_from_log(parse_ascii(f.read()), "golden", 1)
        return policy.to_dict()

    async def enrol_under(
        self,
        verifier: Verifier,
        agent: KernelAgent,
        runtime_policy: str,
        **options: Any,
    ) -> None:
        """Enrol ``agent`` judged by ``runtime_policy`` alone (no PCR
        values), then quiesce ``verifier``: the test drives the rounds."""
        await verifier.commands.enrol(
            agent.uuid,
            os.urandom(32),
            PcrPolicy({}),
            runtime_policy=runtime_policy,
            **options,
        )
        self.quiesce(verifier)


class RuntimeEvidenceTest(KernelAgentCase):
    async def enrol_runtime(
        self, agent: KernelAgent, mb: bool = True, ima: bool = True
    ) -> Any:
        verifier = self.new_verifier()
        if ima:
            verifier.policies.add("runtime", self.good_policy(agent))
        if mb:
            verifier.policies.add(
                "measured-boot", SoftKernel.golden_mb_policy(), name="fw"
            )
        await verifier.commands.enrol(
            agent.uuid,
            os.urandom(32),
            PcrPolicy({}),
            runtime_policy="golden" if ima else None,
            mb_policy="fw" if mb else None,
        )
        self.quiesce(verifier)
        return verifier

    # -- the good path -----------------------------------------------------------

    async def test_good_node_attested_and_list_read_incrementally(self) -> None:
        agent = self.new_kernel_agent()
        verifier = await self.enrol_runtime(agent)
        view = await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual("attested", view.state)
        self.assertEqual(3, view.ima_entries)
        self.assertEqual("0", agent.quote_requests[0]["ima_from"])
        self.assertEqual("1", agent.quote_requests[0]["mb"])
        self.assertIn("10", agent.quote_requests[0]["pcrs"].split(","))
        agent.kernel.measure("/usr/bin/python3", b"py")  # allowed again
        view = await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual("attested", view.state)
        self.assertEqual(4, view.ima_entries)
        last = agent.quote_requests[-1]
        self.assertEqual("3", last["ima_from"])  # only the new entries
        self.assertNotIn("mb", last)  # firmware log checked once per boot

    async def test_long_list_comes_in_parts_and_must_end_at_the_quote(self) -> None:
        agent = self.new_kernel_agent()
        agent.max_lines = 2
        for i in range(7):
            agent.kernel.measure(f"/opt/app/{i}", b"x")
        verifier = self.new_verifier()
        with open(agent.kernel.ima_path, encoding="utf-8") as f:
            doc = policy_from_log(parse_ascii(f.read()), "app", 1).to_dict()
        verifier.policies.add("runtime", doc)
        await self.enrol_under(verifier, agent, "app")
        view = await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual("attested", view.state)
        self.assertEqual(8, view.ima_entries)
        self.assertEqual(
            ["0", "2", "4", "6"], [r["ima_from"] for r in agent.quote_requests]
        )
        self.assertEqual(1, view.quotes_verified)

    async def test_reboot_restarts_the_replay_and_rechecks_firmware(self) -> None:
        agent = self.new_kernel_agent()
        verifier = await self.enrol_runtime(agent)
        self.assertEqual(
            "attested", (await verifier.rounds.attest_once(agent.uuid)).state
        )
        agent.reboot()
        agent.kernel.measure("/usr/bin/python3", b"py")
        view = await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual("attested", view.state, view.failure_reason)
        self.assertEqual(2, view.ima_entries)
        # the first quote after the reboot shows it: the list is replayed
        # from entry 0 and the new boot's firmware log is asked for at once
        self.assertEqual("1", agent.quote_requests[-1]["mb"])

    async def test_replay_state_survives_a_verifier_restart(self) -> None:
        agent = self.new_kernel_agent()
        verifier = await self.enrol_runtime(agent)
        await verifier.rounds.attest_once(agent.uuid)
        await verifier.stop()
        self.verifiers.remove(verifier)
        agent.kernel.measure("/usr/sbin/sshd", b"ssh")
        second = self.new_verifier()
        await second.sync.sync()
        self.quiesce(second)
        view = await second.rounds.attest_once(agent.uuid)
        self.assertEqual("attested", view.state)
        self.assertEqual("3", agent.quote_requests[-1]["ima_from"])

    # -- attacks and failures: each revokes, naming what failed --------------------

    async def assert_revoked(
        self, verifier: Any, agent: KernelAgent, reason: str
    ) -> str:
        view = await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual("revoked", view.state)
        assert view.failure_reason is not None
        self.assertTrue(view.failure_reason.startswith(reason), view.failure_reason)
        rows = self.outbox_rows()
        self.assertEqual(1, len(rows))
        self.assert_signed_event(rows[0], agent.uuid, reason)
        return view.failure_reason

    async def test_unknown_executable_is_caught_and_named(self) -> None:
        agent = self.new_kernel_agent()
        verifier = await self.enrol_runtime(agent)
        await verifier.rounds.attest_once(agent.uuid)
        agent.kernel.measure("/tmp/.x/rootkit", b"evil")
        reason = await self.assert_revoked(verifier, agent, "ima_policy")
        self.assertIn("entry 3 '/tmp/.x/rootkit': unknown_file", reason)

    async def test_changed_binary_is_a_digest_mismatch(self) -> None:
        agent = self.new_kernel_agent()
        verifier = await self.enrol_runtime(agent)
        await verifier.rounds.attest_once(agent.uuid)
        agent.kernel.measure("/usr/sbin/sshd", b"trojaned sshd")
        reason = await self.assert_revoked(verifier, agent, "ima_policy")
        self.assertIn("'/usr/sbin/sshd': digest_mismatch", reason)

    async def test_list_hiding_an_entry_does_not_replay_to_pcr10(self) -> None:
        agent = self.new_kernel_agent()
        verifier = await self.enrol_runtime(agent)
        await verifier.rounds.attest_once(agent.uuid)
        agent.tpm.extend(10, os.urandom(32))  # measured, but left out of the list
        await self.assert_revoked(verifier, agent, "ima_pcr_mismatch")

    async def test_forged_entry_not_in_the_tpm_fails_replay(self) -> None:
        agent = self.new_kernel_agent()
        verifier = await self.enrol_runtime(agent, mb=False)
        await verifier.rounds.attest_once(agent.uuid)
        agent.kernel.log_only("/usr/bin/python3", b"py")
        # not in PCR 10 yet: waits (the list may run ahead of the quote) ...
        self.assertEqual(
            "attested", (await verifier.rounds.attest_once(agent.uuid)).state
        )
        agent.kernel.measure("/usr/sbin/sshd", b"ssh")
        # ... but nothing after it can ever replay
        await self.assert_revoked(verifier, agent, "ima_pcr_mismatch")

    async def test_list_restarting_without_a_reboot_is_a_gap(self) -> None:
        agent = self.new_kernel_agent()
        verifier = await self.enrol_runtime(agent, mb=False)
        await verifier.rounds.attest_once(agent.uuid)

        def from_zero(answer: dict[str, Any]) -> None:
            answer["ima"]["from"] = 0

        agent.answer_hook = from_zero
        await self.assert_revoked(verifier, agent, "ima_log_gap")

    async def test_secure_boot_off_fails_measured_boot_before_v(self) -> None:
        agent = self.new_kernel_agent()
        agent.reboot(secure_boot=False)
        verifier = await self.enrol_runtime(agent)
        reason = await self.assert_revoked(verifier, agent, "mb_policy")
        self.assertIn("Secure Boot", reason)
        self.assertEqual([], agent.v_posts)

    async def test_firmware_log_not_matching_pcrs_fails(self) -> None:
        agent = self.new_kernel_agent()
        agent.tpm.extend(4, os.urandom(32))  # a boot application not logged
        verifier = await self.enrol_runtime(agent, ima=False)
        reason = await self.assert_revoked(verifier, agent, "mb_pcr_mismatch")
        self.assertIn("PCR 4", reason)

    async def test_missing_ima_log_fails_the_node(self) -> None:
        agent = self.new_kernel_agent()
        verifier = await self.enrol_runtime(agent, mb=False)

        def no_log(answer: dict[str, Any]) -> None:
            del answer["ima"]
            answer["ima_error"] = "/sys/kernel/security/ima: No such file"

        agent.answer_hook = no_log
        reason = await self.assert_revoked(verifier, agent, "ima_log_unavailable")
        self.assertIn("No such file", reason)

    async def test_truncated_list_is_malformed(self) -> None:
        agent = self.new_kernel_agent()
        verifier = await self.enrol_runtime(agent, mb=False)

        def truncate(answer: dict[str, Any]) -> None:
            answer["ima"]["entries"] = answer["ima"]["entries"][:-40]

        agent.answer_hook = truncate
        await self.assert_revoked(verifier, agent, "malformed")

    async def test_a_node_that_never_finishes_its_list_is_revoked(self) -> None:
        agent = self.new_kernel_agent()
        verifier = await self.enrol_runtime(agent, mb=False)

        def endless(answer: dict[str, Any]) -> None:
            answer["ima"]["more"] = True
            answer["ima"]["entries"] = ""

        agent.answer_hook = endless
        await self.assert_revoked(verifier, agent, "evidence_incomplete")

    # -- policies ----------------------------------------------------------------

    async def test_one_policy_object_shared_by_nodes(self) -> None:
        a, b = self.new_kernel_agent(), self.new_kernel_agent()
        verifier = self.new_verifier()
        doc = self.good_policy(a)
        meta, created = verifier.policies.add("runtime", doc)
        self.assertTrue(created)
        self.assertEqual((meta, False), verifier.policies.add("runtime", doc))
        for agent in (a, b):
            await verifier.commands.enrol(
                agent.uuid, os.urandom(32), PcrPolicy({}), runtime_policy="golden"
            )
        self.quiesce(verifier)
        self.assertIs(
            verifier.nodes.live(a.uuid).runtime, verifier.nodes.live(b.uuid).runtime
        )

    async def test_enrol_with_unknown_policy_stores_nothing(self) -> None:
        agent = self.new_kernel_agent()
        verifier = self.new_verifier()
        with self.assertRaises(NotFoundError) as ctx:
            await verifier.commands.enrol(
                agent.uuid, os.urandom(32), PcrPolicy({}), runtime_policy="nope"
            )
        self.assertEqual("unknown_policy", ctx.exception.code)
        self.assertIsNone(self.row(agent.uuid))

    async def test_enrol_checking_nothing_is_refused(self) -> None:
        agent = self.new_kernel_agent()
        verifier = self.new_verifier()
        with self.assertRaises(RequestError) as ctx:
            await verifier.commands.enrol(agent.uuid, os.urandom(32), PcrPolicy({}))
        self.assertEqual("no_policy", ctx.exception.code)

    async def test_policy_in_use_cannot_be_deleted(self) -> None:
        agent = self.new_kernel_agent()
        verifier = await self.enrol_runtime(agent, mb=False)
        with self.assertRaises(ConflictError) as ctx:
            verifier.policies.delete("runtime", "golden")
        self.assertEqual("policy_in_use", ctx.exception.code)
        self.assertEqual(1, len(verifier.policies.list("runtime")))

    async def test_bad_policies_are_refused_with_the_reason(self) -> None:
        verifier = self.new_verifier()
        bad = {"name": "x", "version": 1, "excludes": ["(unclosed"]}
        with self.assertRaises(RequestError) as ctx:
            verifier.policies.add("runtime", bad)
        self.assertEqual("bad_policy", ctx.exception.code)
        self.assertIn("(unclosed", ctx.exception.detail)
        with self.assertRaises(RequestError):
            verifier.policies.add("measured-boot", {"secure_boot": "yes"}, name="m")
        with self.assertRaises(RequestError):
            verifier.policies.add("measured-boot", {"secure_boot": True})  # no name
        self.assertEqual([], verifier.policies.list("runtime"))

    async def test_same_name_and_version_with_other_content_conflicts(self) -> None:
        verifier = self.new_verifier()
        verifier.policies.add("runtime", {"name": "p", "version": 1})
        with self.assertRaises(ConflictError) as ctx:
            verifier.policies.add(
                "runtime", {"name": "p", "version": 1, "excludes": ["/tmp/.*"]}
            )
        self.assertEqual("policy_exists", ctx.exception.code)


def _uuid() -> str:
    return str(uuid.uuid4())
