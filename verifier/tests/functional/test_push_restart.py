"""A push agent across a verifier restart (the shared push store,
migration 0009): real registrar and verifier processes, a
``trusted-agent`` on swtpm in push mode. The verifier is killed (SIGKILL,
no clean shutdown) and started again on the same database and port; the
agent's session, opened with its AK before the restart, is honoured by
the new process -- the agent never opens another -- and the node stays
attested.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from typing import Any

import testtools

from trusted_testing.cluster import LocalCluster, free_port, wait_until
from trusted_testing.e2e import Http
from verifier.protocol import PcrPolicy

INTERVAL = 0.5
PAYLOAD = b'#!/bin/sh\necho "payload ran on $TRUSTED_NODE_UUID"\n'


class PushRestartTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.tmp = tempfile.mkdtemp(prefix="trusted-push-restart-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        port = free_port()
        self.cluster = LocalCluster(
            os.path.join(self.tmp, "cluster"),
            nodes=1,
            interval=INTERVAL,
            verifier_sections={
                "push": {"port": port, "min_interval": 0.1, "challenge_ttl": 5.0}
            },
        )
        self.addCleanup(self.cluster.stop)
        self.cluster.start_services()
        node = self.node = self.cluster.nodes[0]
        node.agent_options = {
            "attestation_mode": "push",
            "push_url": f"https://127.0.0.1:{port}",
            "verifier_clients": "nobody",
            "cert_file": None,
            "key_file": None,
        }
        self.cluster.start_agent(node)
        self.http = Http(self.cluster)
        self.loop = asyncio.new_event_loop()
        self.addCleanup(self.loop.close)
        self.tenant = self.cluster.tenant()
        self.addCleanup(lambda: self.loop.run_until_complete(self.tenant.close()))

    def view(self) -> dict[str, Any]:
        url = f"{self.cluster.verifier_url}/v1/nodes/{self.node.uuid}"
        r = self.http.call("GET", url)
        return dict(r.json()) if r.status_code == 200 else {}

    def sessions_opened(self) -> int:
        with open(self.node.log, encoding="utf-8") as f:
            return f.read().count("opened a push session")

    def test_restarted_verifier_honours_the_agents_push_session(self) -> None:
        registered = wait_until(
            lambda: (
                self.http.call(
                    "GET", f"{self.cluster.registrar_url}/v1/agents/{self.node.uuid}"
                ).status_code
                == 200
            ),
            60,
        )
        self.assertTrue(registered)
        policy = PcrPolicy.from_dict({"pcrs": {"16": [self.cluster.good_pcr_hex()]}})
        self.loop.run_until_complete(
            self.tenant.enrol(self.node.uuid, PAYLOAD, policy, mode="push")
        )
        self.assertTrue(wait_until(lambda: self.view().get("state") == "attested", 30))
        self.assertEqual(1, self.sessions_opened())
        self.cluster.kill_verifier(0)
        self.cluster.start_verifier(0)
        before = self.view()["quotes_verified"]
        more = wait_until(lambda: self.view()["quotes_verified"] >= before + 3, 30)
        self.assertTrue(more, self.view())
        self.assertEqual("attested", self.view()["state"])
        self.assertEqual(1, self.sessions_opened())  # the session outlived it
