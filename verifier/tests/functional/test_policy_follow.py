"""Policies that follow the VM, end to end (issue 28): real registrar,
verifier and agent processes on swtpm, with soft firmware and kernels that
write a UEFI event log and an IMA list while extending the swtpm's PCRs.

The tenant enrols one node following the runtime policy ``web-tier`` by
name and one pinned to ``web-tier@1``, then publishes version 2, which
allows one more program (the "patch"). The following node keeps attesting
across the new version, its status shows version 2, and the entries
judged after the switch are judged by it: the patched program passes, a
program neither version allows revokes it with ``unknown_file``. The
pinned node stays on version 1 until its tenant sets it to follow with
``trusted-tenant node set-policy``. Each change is a signed
``node.policy_changed`` event; the revocation hooks run only for the
revocation.
"""

from __future__ import annotations

import json
from typing import Any

from trusted_testing.cluster import wait_until
from trusted_testing.cluster_case import ClusterTestCase
from verifier.protocol import PcrPolicy
from verifier.protocol.events import PolicyChange
from verifier.protocol.ima import parse_ascii, policy_from_log

INTERVAL = 0.5
PAYLOAD = b'#!/bin/sh\necho "payload ran on $TRUSTED_NODE_UUID"\n'
GOOD_FILES = (("/usr/bin/python3.11", b"python"), ("/usr/sbin/nginx", b"nginx"))
PATCHED = ("/usr/sbin/nginx-1.24.1", b"nginx, patched")
ROGUE = ("/tmp/.cache/miner", b"cryptominer")


class PolicyFollowTest(ClusterTestCase):
    """One deployment of two nodes for the class."""

    prefix = "policy-follow-"
    node_count = 2
    interval = INTERVAL
    evidence = True
    measured = GOOD_FILES

    def runtime(self, uuid: str) -> dict[str, Any]:
        return dict(self.status(uuid)["policies"]["runtime"])

    def policy_changes(self, uuid: str) -> list[tuple[str, PolicyChange]]:
        events = self.run_async(self.tenant.events(uuid))
        return [
            (e["reason"], PolicyChange.from_detail(e["detail"]))
            for e in (item["signed_event"]["event"] for item in events)
            if e["type"] == "node.policy_changed"
        ]

    def test_following_node_attests_across_a_new_version(self) -> None:
        follower, pinned = self.cluster.nodes
        with open(self.kernel(follower).ima_path, encoding="utf-8") as f:
            golden = policy_from_log(parse_ascii(f.read()), "web-tier", 1).to_dict()
        self.run_async(self.tenant.add_policy("runtime", golden))
        for node, ref in ((follower, "web-tier"), (pinned, "web-tier@1")):
            self.run_async(
                self.tenant.enrol(node.uuid, PAYLOAD, PcrPolicy({}), runtime_policy=ref)
            )
        for node in (follower, pinned):
            view = self.wait_for(node.uuid, lambda s: s["state"] == "attested")
            self.assertEqual("attested", view["state"], view)
        self.assertEqual((1, True), _version(self.runtime(follower.uuid)))
        self.assertEqual((1, False), _version(self.runtime(pinned.uuid)))
        entries = self.status(follower.uuid)["ima_entries"]

        # the patch: version 2 allows the new program
        v2 = json.loads(json.dumps(golden))
        v2["version"] = 2
        v2["digests"][PATCHED[0]] = [f"sha256:{_sha256(PATCHED[1])}"]
        meta = self.run_async(self.tenant.add_policy("runtime", v2))
        self.assertEqual(2, meta["version"])
        runtime = self.runtime(follower.uuid)
        self.assertEqual((2, True), _version(runtime))
        self.assertEqual(meta["digest"], runtime["digest"])
        self.assertEqual((1, False), _version(self.runtime(pinned.uuid)))

        # the follower runs it: judged by version 2, its replay goes on
        self.kernel(follower).measure(*PATCHED)
        view = self.wait_for(follower.uuid, lambda s: s["ima_entries"] == entries + 1)
        self.assertEqual(("attested", entries + 1), (view["state"],
                                                     view["ima_entries"]))  # fmt: skip
        quotes = view["quotes_verified"]
        view = self.wait_for(follower.uuid, lambda s: s["quotes_verified"] > quotes + 2)
        self.assertEqual("attested", view["state"], view)
        out = self.cli("status", follower.uuid)
        self.assertEqual(0, out.returncode, out.stderr)
        self.assertIn("runtime policy: web-tier@2 (follows web-tier)", out.stdout)

        # the pinned node is set to follow by its tenant, on the command line
        out = self.cli(
            "node", "set-policy", pinned.uuid, "--runtime-policy", "web-tier"
        )
        self.assertEqual(0, out.returncode, out.stderr)
        self.assertIn("runtime policy: web-tier@2 (follows web-tier)", out.stdout)
        self.kernel(pinned).measure(*PATCHED)
        view = self.wait_for(pinned.uuid, lambda s: s["ima_entries"] == entries + 1)
        self.assertEqual("attested", view["state"], view)

        # bad input on the command line: one line, nothing changed
        out = self.cli(
            "node", "set-policy", pinned.uuid, "--runtime-policy", "web-tier@9"
        )
        self.assertEqual(1, out.returncode)
        self.assertEqual(1, out.stderr.count("\n"), out.stderr)
        self.assertIn("web-tier@9", out.stderr)
        self.assertEqual((2, True), _version(self.runtime(pinned.uuid)))

        # a program neither version allows
        self.kernel(follower).measure(*ROGUE)
        view = self.wait_for(follower.uuid, lambda s: s["state"] == "revoked")
        self.assertEqual("revoked", view["state"])
        self.assertIn(f"'{ROGUE[0]}': unknown_file", view["failure_reason"])

        # the history: the policy changes, signed; the hooks act on the
        # revocation only
        (change,) = self.policy_changes(follower.uuid)
        self.assertEqual("follow", change[0])
        assert change[1].old is not None and change[1].new is not None
        self.assertEqual((1, 2), (change[1].old["version"], change[1].new["version"]))
        (change,) = self.policy_changes(pinned.uuid)
        self.assertEqual("set", change[0])
        hooked = wait_until(
            lambda: [
                r
                for r in self.cluster.hook_records()
                if r["node_uuid"] == follower.uuid
            ],
            10,
        )
        self.assertTrue(hooked, "the revocation hook did not fire")
        self.assertEqual(
            [],
            [r for r in self.cluster.hook_records() if r["node_uuid"] == pinned.uuid],
        )


def _version(runtime: dict[str, Any]) -> tuple[int, bool]:
    return runtime["version"], runtime["follows"]


def _sha256(content: bytes) -> str:
    import hashlib

    return hashlib.sha256(content).hexdigest()
