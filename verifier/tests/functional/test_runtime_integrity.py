"""Runtime integrity end to end: real registrar, verifier and agent
processes on swtpm; each node's soft firmware and kernel write a UEFI event
log and an IMA list while extending the swtpm's PCRs; the tenant stores a
runtime and a measured-boot policy at the verifier and enrols nodes with
them by name. A file run on a node that its policy does not allow is
caught on the next quote, named in the node's status, in the signed
revocation event and in what the hooks receive; the other nodes stay
trusted.
"""

from __future__ import annotations

import hashlib
import time

from node_agent.trial.eventlog import sample_log
from nova_plugin.exceptions import AttestationFailedError, ServiceError
from trusted_testing.cluster import NodeHandle, wait_until
from trusted_testing.cluster_case import ClusterTestCase
from trusted_testing.softkernel import BOOTLOADER, KERNEL, SoftKernel
from verifier.common.tpm import Tpm
from verifier.protocol import PcrPolicy
from verifier.protocol.ima import parse_ascii, policy_from_log

INTERVAL = 0.5
PAYLOAD = b'#!/bin/sh\necho "payload ran on $TRUSTED_NODE_UUID"\n'
GOOD_FILES = (("/usr/bin/python3.11", b"python"), ("/usr/sbin/nginx", b"nginx"))


class RuntimeIntegrityTest(ClusterTestCase):
    """One deployment of three nodes for the class."""

    prefix = "runtime-integrity-"
    node_count = 3
    interval = INTERVAL
    evidence = True
    measured = GOOD_FILES
    wait_timeout = 15

    @classmethod
    def set_up_cluster(cls) -> None:
        # the tenant's golden node: its list becomes the runtime policy
        with open(cls.kernel(cls.cluster.nodes[0]).ima_path, encoding="utf-8") as f:
            golden = policy_from_log(parse_ascii(f.read()), "web-tier", 1)
        cls.run_async(cls.tenant.add_policy("runtime", golden.to_dict()))
        cls.run_async(
            cls.tenant.add_policy(
                "measured-boot", SoftKernel.golden_mb_policy(), name="golden-fw"
            )
        )

    def enrol(self, node: NodeHandle) -> None:
        self.run_async(
            self.tenant.enrol(
                node.uuid,
                PAYLOAD,
                PcrPolicy({}),
                runtime_policy="web-tier",
                mb_policy="golden-fw",
            )
        )

    def test_runtime_policy_catches_an_unknown_binary_on_the_next_quote(self) -> None:
        good, victim = self.cluster.nodes[0], self.cluster.nodes[1]
        for node in (good, victim):
            self.enrol(node)
        for node in (good, victim):
            view = self.wait_for(node.uuid, lambda s: s["state"] == "attested")
            self.assertEqual("attested", view["state"], view)
            self.assertEqual(3, view["ima_entries"])
            wait_until(lambda n=node: n.payload_output(), 10)
            self.assertIn(node.uuid, node.payload_output() or "")
        # more allowed files: the verifier reads only the new entries
        self.kernel(good).measure(*GOOD_FILES[0])
        view = self.wait_for(good.uuid, lambda s: s["ima_entries"] == 4)
        self.assertEqual(("attested", 4), (view["state"], view["ima_entries"]))
        # someone runs a dropped binary on the victim
        self.kernel(victim).measure("/tmp/.cache/miner", b"cryptominer")
        view = self.wait_for(victim.uuid, lambda s: s["state"] == "revoked")
        self.assertEqual("revoked", view["state"])
        self.assertIn(
            "entry 3 '/tmp/.cache/miner': unknown_file", view["failure_reason"]
        )
        events = self.run_async(self.tenant.events(victim.uuid))
        self.assertEqual(1, len(events))
        event = events[0]["signed_event"]["event"]
        self.assertEqual("ima_policy", event["reason"])
        self.assertIn("/tmp/.cache/miner", event["detail"])
        hooked = wait_until(
            lambda: [
                r for r in self.cluster.hook_records() if r["node_uuid"] == victim.uuid
            ],
            10,
        )
        self.assertTrue(hooked, "the revocation hook did not fire")
        self.assertIn("/tmp/.cache/miner", str(hooked))
        # the good node is unaffected
        self.kernel(good).measure(*GOOD_FILES[1])
        view = self.wait_for(good.uuid, lambda s: s["ima_entries"] == 5)
        self.assertEqual("attested", view["state"])
        # what the tenant CLI shows
        done = self.cli("status", victim.uuid)
        done.check_returncode()
        out = done.stdout
        self.assertIn("REVOKED", out)
        self.assertIn("/tmp/.cache/miner", out)

    def test_node_lying_about_its_boot_chain_is_never_bootstrapped(self) -> None:
        node = self.cluster.nodes[2]
        kernel = self.kernel(node)
        # the node booted a kernel of its own choice, then hands over the
        # golden image's firmware log: the log no longer replays to PCR 4
        with open(kernel.mb_path, "wb") as f:
            f.write(sample_log(bootloader=BOOTLOADER, kernel=KERNEL, locality=None))
        with Tpm(node.swtpm.tcti) as tpm:
            tpm.pcr_extend(4, hashlib.sha256(b"a kernel of its own").digest())
        # the verifier revokes it at its first quote, before the tenant's
        # identity check through the relay: the tenant sends no U and
        # takes its enrolment back; the signed event names the reason
        with self.assertRaises(AttestationFailedError) as ctx:
            self.enrol(node)
        self.assertIn("failed the verifier's attestation", str(ctx.exception))
        with self.assertRaises(ServiceError) as gone:
            self.status(node.uuid)
        self.assertEqual(404, gone.exception.status)
        (event,) = self.run_async(self.tenant.events(node.uuid))
        signed = event["signed_event"]["event"]
        self.assertEqual("mb_pcr_mismatch", signed["reason"])
        time.sleep(2 * INTERVAL)
        self.assertIsNone(node.payload_output())  # V was never released

    def test_policy_api_bad_input(self) -> None:
        with self.assertRaises(ServiceError) as ctx:
            self.run_async(
                self.tenant.add_policy(
                    "runtime", {"name": "x", "version": 1, "excludes": ["(bad"]}
                )
            )
        self.assertIn("400", str(ctx.exception))
        self.assertIn("(bad", str(ctx.exception))
        with self.assertRaises(ServiceError) as ctx:
            self.run_async(self.tenant.policy("runtime", "no-such-policy"))
        self.assertIn("404", str(ctx.exception))
        with self.assertRaises(ServiceError) as ctx:
            self.run_async(self.tenant.policies("firmware"))
        self.assertIn("404", str(ctx.exception))
        url = f"{self.cluster.verifier_url}/v1/policies/runtime"
        r = self.http.call("POST", url, data=b"{" + b" " * (65 << 20) + b"}")
        self.assertEqual(413, r.status_code)
        self.assertEqual("policy_too_large", r.json()["error"]["code"])
        names = [p["name"] for p in self.run_async(self.tenant.policies("runtime"))]
        self.assertEqual(["web-tier"], names)
