"""A way back, end to end: real registrar, verifier and ``trusted-agent``
processes on swtpm. A node its tenant deleted is enrolled again -- a new
K, U and V -- and its agent, never restarted, runs the new payload once
the new enrolment's first quote passed (a polled node and a pushing one).
An enrolment whose first quote fails tells the tenant why, on the API and
in ``trusted-tenant enrol``'s one line; the same node can then be enrolled
again with the right policy.
"""

from __future__ import annotations

import json
import os

from nova_plugin.exceptions import AttestationFailedError
from trusted_testing.cluster import PCR, NodeHandle, wait_until
from trusted_testing.cluster_case import ClusterTestCase
from verifier.protocol import PcrPolicy
from verifier.protocol.attestation import AttestationMode

INTERVAL = 0.5


def payload(name: str) -> bytes:
    return f'#!/bin/sh\necho "{name} on $TRUSTED_NODE_UUID"\n'.encode()


class ReenrolmentTest(ClusterTestCase):
    """One deployment for the class: a polled node and a pushing one."""

    prefix = "trusted-reenrol-"
    node_count = 2
    interval = INTERVAL
    push = True

    @classmethod
    def prepare(cls) -> None:
        cls.cluster.nodes[1].agent_options = {
            "attestation_mode": "push",
            "push_url": cls.push_url,
        }

    @classmethod
    def set_up_cluster(cls) -> None:
        cls.good = PcrPolicy.from_dict(
            {"pcrs": {str(PCR): [cls.cluster.good_pcr_hex()]}}
        )

    def assert_registered(self, node: NodeHandle) -> None:
        found = wait_until(
            lambda: self.run_async(self.tenant.activated_record(node.uuid)), 60, 0.3
        )
        self.assertIsNotNone(found, f"agent {node.index} never registered")

    def enrol(
        self, node: NodeHandle, name: str, mode: AttestationMode, policy: PcrPolicy
    ) -> None:
        self.run_async(self.tenant.enrol(node.uuid, payload(name), policy, mode=mode))

    def attested_with(self, node: NodeHandle, name: str) -> None:
        """The node is attested and its agent ran the payload ``name``."""
        expected = f"{name} on {node.uuid}\n"
        text = wait_until(lambda: node.payload_output() == expected or None, 30, 0.2)
        self.assertTrue(text, (node.payload_output(), open(node.log).read()[-3000:]))
        view = wait_until(
            lambda: (
                (s := self.run_async(self.tenant.status(node.uuid)))["state"]
                == "attested"
                and s
            ),
            30,
            0.2,
        )
        self.assertTrue(view, self.run_async(self.tenant.status(node.uuid)))

    def check_way_back(self, node: NodeHandle, mode: AttestationMode) -> None:
        self.assert_registered(node)
        assert node.proc is not None
        pid = node.proc.pid
        self.enrol(node, "first", mode, self.good)
        self.attested_with(node, "first")
        self.run_async(self.tenant.delete(node.uuid))
        # the same node again, without touching its agent: new K, U and V
        self.enrol(node, "second", mode, self.good)
        self.attested_with(node, "second")
        self.assertIsNone(node.proc.poll())
        self.assertEqual(pid, node.proc.pid)  # never restarted
        with open(os.path.join(node.work_dir, "payload"), "rb") as f:
            self.assertEqual(payload("second"), f.read())
        status = wait_until(node.payload_status, 30, 0.2)  # written at exit
        self.assertEqual({"exit_code": 0}, status)

    def test_deleted_polled_node_is_enrolled_again_without_restarting_its_agent(
        self,
    ) -> None:
        node = self.cluster.nodes[0]
        self.check_way_back(node, AttestationMode.PULL)
        self.run_async(self.tenant.delete(node.uuid))
        # an enrolment whose first quote fails says why (a PCR 16 value
        # this node does not have)
        wrong = PcrPolicy.from_dict({"pcrs": {str(PCR): ["00" * 32]}})
        with self.assertRaises(AttestationFailedError) as ctx:
            self.enrol(node, "never", AttestationMode.PULL, wrong)
        # whichever judges first names the reason: the verifier's first
        # quote (the node is revoked) or the tenant's identity quote
        named = (
            r"(is revoked|failed its identity quote, nothing was sent): pcr_policy: "
        )
        self.assertRegex(str(ctx.exception), named)
        # the CLI's one line says the same
        policy_file = os.path.join(self.tmp, "wrong-policy.json")
        with open(policy_file, "w", encoding="utf-8") as f:
            json.dump({"pcrs": {str(PCR): ["00" * 32]}}, f)
        payload_file = os.path.join(self.tmp, "payload.sh")
        with open(payload_file, "wb") as f:
            f.write(payload("never"))
        done = self.cli(
            "enrol", node.uuid, "--payload", payload_file, "--policy", policy_file
        )
        self.assertNotEqual(0, done.returncode, done.stdout)
        self.assertRegex(done.stderr, named)
        self.assertNotIn("Traceback", done.stderr)
        self.assertEqual(f"second on {node.uuid}\n", node.payload_output())
        # and back again with the right policy: the agent takes a new pair
        self.enrol(node, "third", AttestationMode.PULL, self.good)
        self.attested_with(node, "third")

    def test_deleted_push_node_is_enrolled_again_without_restarting_its_agent(
        self,
    ) -> None:
        self.check_way_back(self.cluster.nodes[1], AttestationMode.PUSH)
