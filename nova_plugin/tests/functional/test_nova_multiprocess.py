"""Integration: trusted boot through Nova 34 running as separate processes.

Nova here is a deployment, not a fixture (see :mod:`novadeploy`): the
compute API and Placement as WSGI processes, ``nova-conductor``,
``nova-scheduler`` and ``nova-compute`` (fake virt driver) as their own
processes, talking over a scratch vhost of the machine's RabbitMQ, with
Glance and Neutron as the tiny HTTP stand-ins of :mod:`standins`. The
registrar and verifier are a :class:`LocalCluster`; ``trusted-nova-listener``
is its own process on the same bus. Nothing of Nova is imported into this
process: the tenant's CLI talks HTTP to nova-api, and the instance's life
reaches the verifier only as Nova's versioned notifications over RabbitMQ.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
from typing import Any

import fixtures
import testtools
from testtools.content import text_content

from nova_plugin.userdata import parse_user_data
from trusted_testing.cluster import PCR, LocalCluster, wait_until
from trusted_testing.nova.cli import run_cli, tenant_argv
from trusted_testing.nova.deploy import TENANT_HEADERS, NovaDeployment
from trusted_testing.nova.standins import IMAGE_ID

SECRET = b"TOP-SECRET-MULTIPROCESS-MARKER"
PAYLOAD = b'#!/bin/sh\necho "payload ran on $TRUSTED_NODE_UUID"\n# ' + SECRET + b"\n"


class NovaMultiProcessRabbitTest(testtools.TestCase):
    """One deployment for the class (~35 s to bring up on 2 cores)."""

    tmp: str
    cluster: LocalCluster
    nova: NovaDeployment

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.tmp = tempfile.mkdtemp(prefix="trusted-novamp-")
        os.makedirs(os.path.join(cls.tmp, "nova"))
        cls.cluster = LocalCluster(os.path.join(cls.tmp, "cluster"), nodes=0)
        cls.nova = NovaDeployment(os.path.join(cls.tmp, "nova"))
        try:
            cls.cluster.start()
            cls.nova.start()
            cls.cluster.start_nova_listener(cls.nova.transport_url)
            if not wait_until(cls._queue_declared, 60, 0.5):
                raise RuntimeError("trusted-nova-listener never declared its queue")
        except BaseException:
            cls._stop_all()
            raise

    @classmethod
    def tearDownClass(cls) -> None:
        cls._stop_all()
        super().tearDownClass()

    @classmethod
    def _stop_all(cls) -> None:
        try:
            cls.cluster.stop()  # the listener too
        finally:
            try:
                cls.nova.stop()
            finally:
                shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def _queue_declared(cls) -> bool:
        out = subprocess.run(
            ["rabbitmqctl", "-q", "list_queues", "-p", str(cls.nova.vhost), "name"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        ).stdout
        return "trusted-cloud" in out

    # -- helpers ------------------------------------------------------------

    def _write(self, name: str, data: bytes) -> str:
        path = os.path.join(self.useFixture(fixtures.TempDir()).path, name)
        with open(path, "wb") as f:
            f.write(data)
        return path

    def boot_argv(self) -> list[str]:
        env = self.cluster.tenant_env()
        policy = {"pcrs": {str(PCR): [self.cluster.good_pcr_hex()]}}
        headers = []
        for name, value in TENANT_HEADERS.items():
            headers += ["--nova-header", f"{name}:{value}"]
        return [
            "boot",
            "trusted-vm",
            "--flavor",
            "trusted.small",
            "--image",
            IMAGE_ID,
            "--nic",
            "none",
            "--payload",
            self._write("payload.sh", PAYLOAD),
            "--trust-policy",
            self._write("policy.json", json.dumps(policy).encode()),
            *tenant_argv(env, self.nova.api_url, None),
            "--os-compute-api-version",
            "2.37",
            *headers,
        ]

    def run_cli(self, argv: list[str]) -> tuple[int, str, str]:
        return run_cli(argv)

    def node(self, uuid: str) -> dict[str, Any] | None:
        return self.cluster.node_status(uuid)

    def status(self, uuid: str) -> str | None:
        server = self.nova.server(uuid)
        return None if server is None else str(server["status"])

    # -- the flow -------------------------------------------------------------

    def test_boot_enrol_create_end_and_delete_over_rabbitmq(self) -> None:
        self.addDetail(
            "nova-bring-up",
            text_content(f"{self.nova.bring_up_seconds:.1f} s"),
        )
        code, out, err = self.run_cli(self.boot_argv())
        self.assertEqual(0, code, err)
        row = json.loads(out.splitlines()[0])
        uuid = row["id"]
        state = wait_until(lambda: self.status(uuid) in ("ACTIVE", "ERROR"), 90, 0.5)
        self.assertTrue(state, self.nova.server(uuid))
        server = self.nova.server(uuid)
        assert server is not None
        self.assertEqual("ACTIVE", server["status"], server.get("fault"))
        self.assertEqual(self.nova.host, server["OS-EXT-SRV-ATTR:host"])
        # what Nova stored (admin view, microversion 2.3) is ciphertext only
        stored = base64.b64decode(server["OS-EXT-SRV-ATTR:user_data"])
        self.assertNotIn(SECRET, stored)
        self.assertNotIn(b"payload ran on", stored)
        config, envelope = parse_user_data(stored)
        self.assertTrue(envelope.startswith(b"TCP1"))  # an AES-GCM envelope
        self.assertNotIn(SECRET, envelope)
        self.assertEqual(row["boot_id"], config["boot_id"])
        self.assertEqual(self.cluster.registrar_url, config["registrar_url"])
        # Nova itself asked the image stand-in about the image
        self.assertIn(f"GET /v2/images/{IMAGE_ID}", self.nova.standins.requests)
        # the verifier holds the enrolment; nova-compute's instance.create.end
        # went over RabbitMQ to the listener process, which marked it created
        node = wait_until(
            lambda: (n := self.node(uuid)) and n["state"] == "created" and n, 60, 0.5
        )
        self.assertTrue(node, self.node(uuid))
        # deleting the server unenrols it through instance.delete.end
        resp = self.nova.request("DELETE", f"/servers/{uuid}")
        self.assertEqual(204, resp.status_code, resp.text)
        # Nova's own delete (API -> conductor -> compute over RabbitMQ) took
        # over 60 s once on a loaded 2-core machine: allow it 120 s
        self.assertTrue(
            wait_until(lambda: self.status(uuid) is None, 120, 0.5),
            self.nova.server(uuid),
        )
        self.assertTrue(
            wait_until(lambda: self.node(uuid) is None, 60, 0.5), self.node(uuid)
        )
