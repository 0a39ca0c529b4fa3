"""A node judged by a runtime delta (issue 28) in the verifier service:
what the base allows and what the delta adds pass; what neither allows
revokes the node, naming the file; the node's policy object is the store's
one composed object, over the store's one base object.

Fake agents answer with real quotes of a SoftTpm whose PCRs a
:class:`SoftKernel` extends exactly as the kernel would.
"""

from __future__ import annotations

import hashlib
import os

from verifier.protocol import PcrPolicy
from verifier.protocol.ima import RuntimePolicy, parse_ascii, policy_from_log
from verifier.protocol.messages.policy_check import CheckResult, PolicyCheckRequest
from verifier.tests.unit.test_attest_runtime import KernelAgent, _uuid
from verifier.tests.unit.test_attest_service import VerifierServiceBase


class DeltaAttestationTest(VerifierServiceBase):
    def new_agent(self) -> KernelAgent:
        directory = os.path.join(self.tmp, "node")
        os.makedirs(directory)
        agent = KernelAgent(_uuid(), next(self._ports), directory)
        self.agents.add(agent)
        self.registrar.add(agent)
        return agent

    async def test_a_node_on_a_delta_is_judged_by_base_and_delta(self) -> None:
        agent = self.new_agent()
        agent.kernel.measure("/usr/bin/python3", b"py")
        with open(agent.kernel.ima_path, encoding="utf-8") as f:
            base_doc = policy_from_log(parse_ascii(f.read()), "golden", 1).to_dict()
        verifier = self.new_verifier()
        base, _ = verifier.policies.add("runtime", base_doc)
        new = "sha256:" + hashlib.sha256(b"patched").hexdigest()
        delta, _ = verifier.policies.add(
            "runtime",
            {
                "name": "golden",
                "version": 2,
                "base": base["digest"],
                "digests": {"/usr/lib/libpatched.so": [new]},
            },
        )
        await verifier.commands.enrol(
            agent.uuid, os.urandom(32), PcrPolicy({}), runtime_policy="golden@2"
        )
        self.quiesce(verifier)
        policy = verifier.nodes.live(agent.uuid).runtime
        assert isinstance(policy, RuntimePolicy)
        self.assertIs(verifier.policies.load(delta["digest"]), policy)
        self.assertIs(verifier.policies.load(base["digest"]), policy.base)

        agent.kernel.measure("/usr/bin/python3", b"py")  # the base's
        agent.kernel.measure("/usr/lib/libpatched.so", b"patched")  # the delta's
        view = await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual("attested", view.state)

        agent.kernel.measure("/usr/bin/miner", b"evil")  # neither's
        view = await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual("revoked", view.state)
        assert view.failure_reason is not None
        self.assertTrue(view.failure_reason.startswith("ima_policy"))
        self.assertIn("/usr/bin/miner", view.failure_reason)
        self.assertIn("unknown_file", view.failure_reason)

    async def test_the_dry_run_of_a_delta_judges_base_and_delta(self) -> None:
        agent = self.new_agent()
        agent.kernel.measure("/usr/bin/python3", b"py")
        with open(agent.kernel.ima_path, encoding="utf-8") as f:
            base_doc = policy_from_log(parse_ascii(f.read()), "web", 1).to_dict()
        verifier = self.new_verifier()
        base, _ = verifier.policies.add("runtime", base_doc)
        await verifier.commands.enrol(
            agent.uuid, os.urandom(32), PcrPolicy({}), runtime_policy="web@1"
        )
        self.quiesce(verifier)
        self.assertEqual(
            "attested", (await verifier.rounds.attest_once(agent.uuid)).state
        )
        agent.kernel.measure("/usr/bin/upgraded", b"v2")  # an upgrade ran
        for version, path in ((2, "/usr/bin/other"), (3, "/usr/bin/upgraded")):
            digest = "sha256:" + hashlib.sha256(b"v2").hexdigest()
            verifier.policies.add(
                "runtime",
                {
                    "name": "web",
                    "version": version,
                    "base": base["digest"],
                    "digests": {path: [digest]},
                },
            )
        request = PolicyCheckRequest((agent.uuid,))
        lacking = await verifier.checker.check("web@2", "", request)
        (result,) = lacking.results
        self.assertEqual(CheckResult.FAIL, result.result)
        self.assertEqual(
            [("/usr/bin/upgraded", "unknown_file")],
            [(f.path, f.reason) for f in result.failures],
        )
        covering = await verifier.checker.check("web@3", "", request)
        self.assertEqual(CheckResult.PASS, covering.results[0].result)
