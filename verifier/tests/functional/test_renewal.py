"""Renewal as doc/source/admin/renewal.rst writes it, on a running
deployment (real registrar, verifier and an agent on swtpm).

Service certificates: the page's ``renew-services`` block (``openssl`` to
read the expiry, ``trusted-certs`` to reissue from the same CA) runs as
written, paths and host names replaced by the test's; its ``systemctl
restart`` lines are the test restarting the processes. The services then
present the new certificates and the node keeps being quoted and
attested. Node identities: nothing renews one in place; the page's way
(delete and enrol the node again) gives the agent a new certificate from
the node CA without restarting it.
"""

from __future__ import annotations

import os
import re
import signal
import ssl
import subprocess
import sys

from cryptography import x509

from trusted_testing.cluster import PCR, wait_until
from trusted_testing.cluster_case import ClusterTestCase
from trusted_testing.docpages import named_block
from verifier.protocol import PcrPolicy

PAYLOAD = b"#!/bin/sh\necho renewed\n"


def page_block(name: str) -> list[str]:
    """The command lines of the page's ``code-block`` named ``name``."""
    return named_block("admin/renewal.rst", name)


def served_serial(port: int) -> int:
    pem = ssl.get_server_certificate(("127.0.0.1", port))
    return x509.load_pem_x509_certificate(pem.encode()).serial_number


class RenewalTest(ClusterTestCase):
    prefix = "trusted-renewal-"
    node_count = 1
    wait_timeout = 40.0

    @classmethod
    def set_up_cluster(cls) -> None:
        cls.good = PcrPolicy.from_dict(
            {"pcrs": {str(PCR): [cls.cluster.good_pcr_hex()]}}
        )

    def restart(self, name: str) -> None:
        proc = self.cluster.procs[name]
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        if name == "registrar":
            self.cluster._start_registrar()
        else:
            self.cluster.start_verifier(0)

    def identity_serial(self) -> int | None:
        path = os.path.join(self.cluster.nodes[0].work_dir, "identity.pem")
        if not os.path.exists(path):
            return None
        with open(path, "rb") as f:
            return x509.load_pem_x509_certificate(f.read()).serial_number

    def test_service_certificates_renewed_and_node_identity_reissued(self) -> None:
        node = self.cluster.nodes[0]
        self.run_async(self.tenant.enrol(node.uuid, PAYLOAD, self.good))
        self.wait_for(node.uuid, lambda s: s["state"] == "attested")
        first_identity = wait_until(self.identity_serial, 30)
        self.assertIsNotNone(first_identity)
        served = {
            "registrar": served_serial(self.cluster.registrar_port),
            "verifier": served_serial(self.cluster.verifier_port),
        }

        for line in page_block("renew-services"):
            restart = re.fullmatch(
                r"systemctl restart trusted-(registrar|verifier)", line
            )
            if restart:
                self.restart(restart.group(1))
                continue
            line = line.replace("/etc/trusted-cloud/pki", self.cluster.pki)
            line = line.replace(
                "192.0.2.10,registrar.example.org", "127.0.0.1,localhost"
            )
            done = subprocess.run(
                ["bash", "-euc", line],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
                env=dict(os.environ, PATH=os.path.dirname(sys.executable)
                         + os.pathsep + os.environ["PATH"]),
            )  # fmt: skip
            self.assertEqual(0, done.returncode, f"{line}\n{done.stdout}{done.stderr}")
            if line.startswith("openssl"):
                self.assertRegex(done.stdout, r"^notAfter=")

        # the restarted services present the new certificates ...
        self.assertNotEqual(
            served["registrar"], served_serial(self.cluster.registrar_port)
        )
        self.assertNotEqual(
            served["verifier"], served_serial(self.cluster.verifier_port)
        )
        # ... and the node, whose agent was not touched, is quoted on
        quoted = self.status(node.uuid)["quotes_verified"]
        after = self.wait_for(
            node.uuid,
            lambda s: s["state"] == "attested" and s["quotes_verified"] >= quoted + 3,
        )
        self.assertGreaterEqual(after["quotes_verified"], quoted + 3, after)

        # a node identity: delete and enrol again (the agent keeps running)
        self.run_async(self.tenant.delete(node.uuid))
        self.run_async(self.tenant.enrol(node.uuid, PAYLOAD, self.good))
        self.wait_for(node.uuid, lambda s: s["state"] == "attested")
        renewed = wait_until(
            lambda: (s := self.identity_serial()) is not None and s != first_identity,
            30,
        )
        self.assertTrue(renewed, "the agent got no new identity certificate")
