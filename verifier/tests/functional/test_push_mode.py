"""Push and pull attestation side by side on one verifier: real registrar
and verifier processes, ``trusted-agent`` processes on swtpm. The pull
node is polled as always; the push nodes' agents open no port at all, so
they can only be attested -- V, identity certificate and all -- through
the evidence they push. The tenant reaches every node only through the
verifier's relay (the identity quote over its nonce and U sealed to NK):
the pull node's agent accepts no tenant certificate at all.
Tampering revokes either with its signed event, and a push agent that
stops posting is unreachable by its deadline with one.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import ssl
import uuid as uuid_mod
from typing import Any

from trusted_testing.cluster import wait_until
from trusted_testing.cluster_case import ClusterTestCase
from verifier.protocol import PcrPolicy
from verifier.protocol.userdata import BootstrapConfig

INTERVAL = 0.5
PAYLOAD = b'#!/bin/sh\necho "payload ran on $TRUSTED_NODE_UUID"\n'


class PushModeTest(ClusterTestCase):
    """One deployment for the module: a pull node and two push nodes."""

    prefix = "trusted-push-"
    node_count = 3
    interval = INTERVAL
    push = True
    verifier_options = {"max_unreachable": 2}

    @classmethod
    def prepare(cls) -> None:
        # no tenant certificate reaches the pull agent: only the relay
        cls.cluster.nodes[0].agent_options = {"tenant_clients": "nobody"}
        for node in cls.cluster.nodes[1:]:
            node.agent_options = {
                "attestation_mode": "push",
                "push_url": cls.push_url,
                "verifier_clients": "nobody",  # never reachable by the verifier
                "cert_file": None,  # identity by the TPM alone
                "key_file": None,
            }
        # the last one is told to push only by its bootstrap file, as
        # trusted-nova boot --mode push writes it into the user-data
        last = cls.cluster.nodes[2]
        bootstrap = os.path.join(last.dir, "bootstrap.json")
        config = BootstrapConfig(
            str(uuid_mod.uuid4()), cls.cluster.registrar_url, None, cls.push_url
        )
        with open(bootstrap, "w", encoding="utf-8") as f:
            json.dump(config.to_dict(), f)
        del last.agent_options["attestation_mode"], last.agent_options["push_url"]
        last.agent_options["bootstrap_file"] = bootstrap

    @classmethod
    def set_up_cluster(cls) -> None:
        cls.policy = PcrPolicy.from_dict({"pcrs": {"16": [cls.cluster.good_pcr_hex()]}})

    def node_state(self, uuid: str) -> dict[str, Any]:
        r = self.http.call("GET", f"{self.cluster.verifier_url}/v1/nodes/{uuid}")
        self.assertEqual(200, r.status_code, r.text)
        return dict(r.json())

    def wait_state(self, uuid: str, state: str, timeout: float) -> dict[str, Any]:
        wait_until(lambda: self.node_state(uuid)["state"] == state, timeout)
        return self.node_state(uuid)

    def events(self, uuid: str) -> list[dict[str, Any]]:
        return list(self.run_async(self.tenant.events(uuid)))

    def test_pull_and_push_nodes_bootstrap_then_tampering_revokes(self) -> None:
        pull, push = self.cluster.nodes[0], self.cluster.nodes[1]
        self.run_async(self.tenant.enrol(pull.uuid, PAYLOAD, self.policy))
        self.run_async(self.tenant.enrol(push.uuid, PAYLOAD, self.policy, mode="push"))
        # nothing listens on the push agent's port: every inbound
        # connection is refused, so the tenant went through the relay
        self.assertFalse(_accepts(push.port))
        self.assertTrue(_accepts(pull.port))
        for node in (pull, push):  # U went through the relay for both
            relayed = self.http.call(
                "GET", f"{self.cluster.verifier_url}/v1/nodes/{node.uuid}/relay/u"
            )
            self.assertEqual(200, relayed.status_code, relayed.text)
            self.assertEqual("accepted", relayed.json()["state"])
        for node, mode in ((pull, "pull"), (push, "push")):
            status = wait_until(node.payload_status, 30)
            self.assertEqual({"exit_code": 0}, status, node.uuid)
            self.assertEqual(f"payload ran on {node.uuid}\n", node.payload_output())
            self.assertTrue(os.path.exists(os.path.join(node.work_dir, "identity.pem")))
            state = self.wait_state(node.uuid, "attested", 10)
            self.assertEqual(("attested", mode), (state["state"], state["mode"]))
        before = self.node_state(push.uuid)["quotes_verified"]
        wait_until(
            lambda: self.node_state(push.uuid)["quotes_verified"] >= before + 3, 10
        )
        self.assertGreaterEqual(
            self.node_state(push.uuid)["quotes_verified"], before + 3
        )
        with open(push.log, encoding="utf-8") as f:
            log = f.read()
        self.assertIn("opened a push session", log)
        self.assertIn("opens no port (push mode)", log)
        self.assertIn("U relayed by the verifier accepted", log)
        self.cluster.tamper(push)
        state = self.wait_state(push.uuid, "revoked", 4 * INTERVAL + 10)
        self.assertEqual("revoked", state["state"])
        self.assertIn("pcr_policy", state["failure_reason"])
        events = self.events(push.uuid)
        self.assertEqual(
            ["pcr_policy"], [e["signed_event"]["event"]["reason"] for e in events]
        )
        delivered = wait_until(
            lambda: any(
                r["node_uuid"] == push.uuid for r in self.cluster.hook_records()
            ),
            10,
        )
        self.assertTrue(delivered, "revocation hook did not fire")
        self.assertEqual("attested", self.node_state(pull.uuid)["state"])

    def test_push_node_that_stops_posting_is_unreachable_with_a_signed_event(
        self,
    ) -> None:
        node = self.cluster.nodes[2]  # push mode from its bootstrap file
        self.assertFalse(_accepts(node.port))
        self.run_async(self.tenant.enrol(node.uuid, PAYLOAD, self.policy, mode="push"))
        self.wait_state(node.uuid, "attested", 30)
        with open(node.log, encoding="utf-8") as f:
            self.assertIn("the bootstrap file names a push endpoint", f.read())
        before = len(self._records(node.uuid))
        assert node.proc is not None
        os.killpg(node.proc.pid, signal.SIGKILL)  # the agent goes silent
        node.proc.wait()
        # grace (interval + challenge lifetime 5 s), then 2 missed rounds
        state = self.wait_state(node.uuid, "unreachable", 60)
        self.assertEqual("unreachable", state["state"])
        self.assertTrue(state["failure_reason"].startswith("unreachable"))
        # its signed node.unreachable event reaches the hooks' log
        wait_until(lambda: len(self._records(node.uuid)) > before, 10)
        records = self._records(node.uuid)[before:]
        self.assertEqual(["unreachable"], [r["reason"] for r in records], records)
        self.assertIn("no evidence pushed since", records[0]["detail"])
        self.assertEqual("node.unreachable", records[0]["type"])

    def test_pull_agent_refuses_the_tenants_certificate(self) -> None:
        # what the relay spares the tenant: its certificate is no good here
        pull = self.cluster.nodes[0]
        r = self.http.call("GET", f"{self.cluster.registrar_url}/v1/agents/{pull.uuid}")
        ctx = ssl.create_default_context(cadata=r.json()["tls_cert"])
        ctx.check_hostname = False
        ctx.load_cert_chain(
            self.cluster.pki_file("tenant.pem"), self.cluster.pki_file("tenant-key.pem")
        )
        conn = http.client.HTTPSConnection("127.0.0.1", pull.port, context=ctx)
        try:
            conn.request("GET", f"/v1/quote?nonce={'00' * 20}&pcrs=16")
            answer = conn.getresponse()
            self.assertEqual(403, answer.status)
        finally:
            conn.close()

    def test_relay_for_an_unknown_node_is_404(self) -> None:
        url = f"{self.cluster.verifier_url}/v1/nodes/{uuid_mod.uuid4()}/relay/u"
        r = self.http.call("POST", url, json={"u": "VENTMQ" + "A" * 122})
        self.assertEqual(404, r.status_code, r.text)

    def _records(self, uuid: str) -> list[dict[str, Any]]:
        return [r for r in self.cluster.hook_records() if r["node_uuid"] == uuid]


def _accepts(port: int) -> bool:
    """Whether anything accepts a TCP connection on loopback ``port``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True
    except OSError:
        return False
