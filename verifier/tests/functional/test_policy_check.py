"""The dry run of a runtime policy end to end: real registrar, verifier and
agent processes on swtpm; each node's soft kernel writes its IMA list while
extending the swtpm's PCR 10. The tenant stores candidate versions (or
keeps one in a file, ``--file``) and asks the verifier (``trusted-tenant
policy check``) what each would refuse of the nodes' live lists: exactly
the entries a candidate lacks are listed, entry by entry, and nothing
about the nodes changes -- state, events, IMA replay position, quotes
counted.
"""

from __future__ import annotations

import json
import os
import uuid as uuid_mod
from typing import Any

import fixtures

from trusted_testing.cluster import NodeHandle, wait_until
from trusted_testing.cluster_case import ClusterTestCase
from verifier.protocol import PcrPolicy
from verifier.protocol.ima import parse_ascii, policy_from_log

INTERVAL = 0.5
#: the nodes' own quote interval: no regular round falls inside a check
NODE_INTERVAL = 120.0
PAYLOAD = b"#!/bin/sh\ntrue\n"
FILES = (
    ("/usr/bin/python3.11", b"python"),
    ("/usr/sbin/nginx", b"nginx 1.24"),
    ("/usr/lib/libssl.so.3", b"openssl 3.0"),
)


class PolicyCheckTest(ClusterTestCase):
    """Two polled nodes under web@1 for the class; a third is enrolled by
    the test that forges its list, and deleted at its end."""

    prefix = "policy-check-"
    node_count = 3
    interval = INTERVAL
    evidence = True
    measured = FILES

    @classmethod
    def set_up_cluster(cls) -> None:
        entries = parse_ascii(cls.list_text(cls.cluster.nodes[0]))
        cls.web1 = policy_from_log(entries, "web", 1)
        # web@2 lacks nginx (say, built from a smaller package set)
        without = [e for e in entries if e.path != "/usr/sbin/nginx"]
        cls.web2 = policy_from_log(without, "web", 2)
        for policy in (cls.web1, cls.web2):
            cls.run_async(cls.tenant.add_policy("runtime", policy.to_dict()))
        for node in cls.cluster.nodes[:2]:
            cls.enrol(node)

    @classmethod
    def list_text(cls, node: NodeHandle) -> str:
        with open(cls.kernel(node).ima_path, encoding="utf-8") as f:
            return f.read()

    @classmethod
    def enrol(cls, node: NodeHandle) -> None:
        if not wait_until(lambda: cls.registered(node.uuid), 60):
            raise RuntimeError(f"agent {node.index} never registered")
        cls.run_async(
            cls.tenant.enrol(
                node.uuid,
                PAYLOAD,
                PcrPolicy({}),
                runtime_policy="web@1",  # pinned
                interval=NODE_INTERVAL,
            )
        )
        if not wait_until(lambda: cls.state(node.uuid) == "attested", 30):
            raise RuntimeError(f"node {node.uuid} never attested")

    @classmethod
    def state(cls, uuid: str) -> str | None:
        status = cls.cluster.node_status(uuid)
        return None if status is None else status["state"]

    def snapshot(self) -> list[tuple[Any, ...]]:
        """What a check must not change about the nodes."""
        out = []
        for node in self.cluster.nodes[:2]:
            view = self.cluster.node_status(node.uuid)
            assert view is not None
            out.append(
                (
                    view["state"],
                    view["ima_entries"],
                    view["quotes_verified"],
                    view["last_attested_at"],
                    view["runtime_policy"],
                    view["failure_reason"],
                )
            )
        out.append(tuple(self.run_async(self.tenant.events())))
        return out

    def test_check_lists_exactly_what_the_candidate_lacks_and_changes_nothing(
        self,
    ) -> None:
        before = self.snapshot()
        report = self.run_async(
            self.tenant.check_policy(
                "web@2", tuple(n.uuid for n in self.cluster.nodes[:2])
            )
        )
        self.assertEqual(("web", 2), (report.policy.name, report.policy.version))
        self.assertEqual(self.web2.digest.hex(), report.policy.digest)
        pairs = zip(self.cluster.nodes[:2], report.results, strict=True)
        for node, result in pairs:
            self.assertEqual(node.uuid, result.node)
            self.assertEqual("fail", result.result.value, result)
            self.assertEqual(len(FILES) + 1, result.entries)
            self.assertEqual(
                [(2, "/usr/sbin/nginx", "unknown_file")],
                [(f.index, f.path, f.reason) for f in result.failures],
            )
        self.assertEqual(before, self.snapshot())
        # the version in force passes on every node
        report = self.run_async(self.tenant.check_policy("web@1", everything=True))
        self.assertEqual(["pass", "pass"], [r.result.value for r in report.results])
        self.assertEqual(before, self.snapshot())

    def test_cli_prints_each_failing_entry_and_exits_by_the_result(self) -> None:
        node = self.cluster.nodes[1]
        before = self.snapshot()
        done = self.cli("policy", "check", "web@2", "--node", node.uuid)
        self.assertEqual(1, done.returncode, done.stderr)
        self.assertIn(f"{node.uuid}: FAIL (1 of 4 entries would fail)", done.stdout)
        self.assertIn("entry 2 '/usr/sbin/nginx': unknown_file", done.stdout)
        done = self.cli("policy", "check", "web@1", "--all")
        self.assertEqual(0, done.returncode, done.stderr)
        self.assertIn("2 node(s) checked, 2 pass", done.stdout)
        done = self.cli("policy", "check", "web@2", "--all", "--json")
        self.assertEqual(1, done.returncode, done.stderr)
        data = json.loads(done.stdout)
        self.assertEqual({"web"}, {data["policy"]["name"]})
        self.assertEqual(2, len(data["results"]))
        # bad input: one line, exit 2, nothing changed
        unknown = str(uuid_mod.uuid4())
        for argv, words in (
            (("web@9", "--all"), "web@9"),
            (("web@2", "--node", unknown), unknown),
            (("web@2", "--node", "not-a-uuid"), "not-a-uuid"),
        ):
            done = self.cli("policy", "check", *argv)
            self.assertEqual(2, done.returncode, (argv, done.stdout, done.stderr))
            self.assertEqual(1, done.stderr.count("\n"), done.stderr)
            self.assertIn(words, done.stderr)
            self.assertNotIn("Traceback", done.stderr)
        self.assertEqual(before, self.snapshot())

    def test_cli_checks_a_file_before_it_is_stored(self) -> None:
        """``policy check --file web-3.json --base web@2``: the delta that
        adds nginx back, composed with web@2 by the verifier, judged on the
        live lists; nothing stored, nothing about the nodes changed."""
        directory = self.useFixture(fixtures.TempDir()).path
        nginx = self.web1.to_dict()["digests"]["/usr/sbin/nginx"]
        path = os.path.join(directory, "web-3.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"name": "web", "version": 3,
                       "digests": {"/usr/sbin/nginx": nginx}}, f)  # fmt: skip
        stored = self.run_async(self.tenant.policies("runtime"))
        before = self.snapshot()
        node = self.cluster.nodes[0]
        done = self.cli(
            "policy", "check", "--file", path, "--base", "web@2", "--node", node.uuid
        )
        self.assertEqual(0, done.returncode, (done.stdout, done.stderr))
        self.assertIn("runtime policy web@3", done.stdout)
        self.assertIn("1 node(s) checked, 1 pass", done.stdout)
        self.assertIn(f"{node.uuid}: PASS (4 entries)", done.stdout)
        # without its base the additions alone refuse the rest of the list
        done = self.cli("policy", "check", "--file", path, "--all", "--json")
        self.assertEqual(1, done.returncode, (done.stdout, done.stderr))
        data = json.loads(done.stdout)
        self.assertEqual(["fail", "fail"], [r["result"] for r in data["results"]])
        refused = {f["path"] for f in data["results"][0]["failures"]}
        self.assertIn("/usr/bin/python3.11", refused)
        self.assertNotIn("/usr/sbin/nginx", refused)
        # bad input: one line, exit 2
        for argv, words in (
            (("--file", path, "--base", "web@9", "--all"), "web@9"),
            (("--file", os.path.join(directory, "none.json"), "--all"), "none.json"),
            (("web@2", "--file", path, "--all"), "exactly one of"),
        ):
            done = self.cli("policy", "check", *argv)
            self.assertEqual(2, done.returncode, (argv, done.stdout, done.stderr))
            self.assertEqual(1, done.stderr.count("\n"), done.stderr)
            self.assertIn(words, done.stderr)
        self.assertEqual(stored, self.run_async(self.tenant.policies("runtime")))
        self.assertEqual(before, self.snapshot())

    def test_a_forged_list_is_an_error_never_a_pass(self) -> None:
        node = self.cluster.nodes[2]
        self.enrol(node)
        kernel = self.kernel(node)
        kernel.measure("/tmp/.x/miner", b"miner")  # PCR 10 extended
        lines = self.list_text(node).splitlines(keepends=True)
        lines[-1] = kernel.entries[1].to_ascii() + "\n"  # shows python instead
        with open(kernel.ima_path, "w", encoding="utf-8") as f:
            f.write("".join(lines))
        try:
            report = self.run_async(self.tenant.check_policy("web@1", (node.uuid,)))
            (result,) = report.results
            self.assertEqual("error", result.result.value, result)
            self.assertTrue(result.error.startswith("ima_pcr_mismatch: "), result)
            self.assertEqual("attested", self.state(node.uuid))  # judged, not acted on
            self.assertEqual([], self.run_async(self.tenant.events(node.uuid)))
        finally:
            self.run_async(self.tenant.delete(node.uuid))
