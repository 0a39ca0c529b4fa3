"""A freshly booted VM's agent, as real processes on a real swtpm: no
operator certificate, only what cloud-init writes (the bootstrap file, the
instance id, the user-data of ``trusted-nova boot``). It registers by its
TPM (an EK certificate from swtpm's local CA, the registrar's EK anchor),
the tenant sends U alone, the verifier sends V, and the payload from the
user-data runs."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile

import requests
import testtools

from nova_plugin.boot import prepare_user_data
from nova_plugin.userdata import parse_user_data
from trusted_testing.cluster import PCR, LocalCluster, NodeHandle, wait_until
from trusted_testing.e2e import Http
from verifier.protocol import PcrPolicy, split
from verifier.protocol.enroller import commit_u
from verifier.protocol.messages.enrolment import EnrolmentRequest
from verifier.protocol.messages.registration import RegistrationRecord

PAYLOAD = b'#!/bin/sh\necho "payload ran on $TRUSTED_NODE_UUID"\n'


class AgentBootstrapTest(testtools.TestCase):
    cluster: LocalCluster

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.tmp = tempfile.mkdtemp(prefix="agent-bootstrap-")
        # one prepared node: swtpm's local CA exists, the registrar trusts it
        cls.cluster = LocalCluster(os.path.join(cls.tmp, "c"), nodes=1, interval=0.5)
        try:
            cls.cluster.start_services()
        except Exception:
            cls.cluster.stop()
            raise
        cls.tenant_http = Http(cls.cluster, "tenant")
        cls.policy = PcrPolicy.from_dict(
            {"pcrs": {str(PCR): [cls.cluster.good_pcr_hex()]}}
        )

    @classmethod
    def tearDownClass(cls) -> None:
        cls.cluster.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)
        super().tearDownClass()

    def _cloud_init_files(self, node: NodeHandle, user_data: bytes) -> dict[str, str]:
        """What cloud-init leaves in a guest, in the node's directory."""
        config, _ = parse_user_data(user_data)  # what the cloud-config writes
        files = {
            "bootstrap_file": os.path.join(node.dir, "bootstrap.json"),
            "user_data_file": os.path.join(node.dir, "user-data.txt"),
            "instance_data_file": os.path.join(node.dir, "instance-data.json"),
        }
        with open(files["bootstrap_file"], "w", encoding="utf-8") as f:
            json.dump(config, f)
        with open(files["user_data_file"], "wb") as f:
            f.write(user_data)
        with open(files["instance_data_file"], "w", encoding="utf-8") as f:
            json.dump({"v1": {"instance_id": node.uuid.upper()}}, f)
        return files

    def _record(self, uuid: str) -> RegistrationRecord | None:
        url = f"{self.cluster.registrar_url}/v1/agents/{uuid}"
        r = self.tenant_http.call("GET", url)
        return RegistrationRecord.from_dict(r.json()) if r.status_code == 200 else None

    def test_agent_without_operator_certificate_runs_the_user_data_payload(
        self,
    ) -> None:
        node = self.cluster.nodes[0]
        with open(self.cluster.pki_file("ca.pem"), encoding="utf-8") as f:
            ca_pem = f.read()
        key, _, _, user_data = prepare_user_data(
            PAYLOAD, self.cluster.registrar_url, ca_pem
        )
        files = self._cloud_init_files(node, user_data)
        # nothing of the operator's but what the user-data carries
        node.agent_options = {
            **files,
            "uuid": None,
            "registrar_url": None,
            "ca_file": None,
            "cert_file": None,
            "key_file": None,
        }
        self.cluster.start_agent(node)
        record = wait_until(lambda: self._record(node.uuid), 60, 0.3)
        self.assertIsNotNone(record, open(node.log).read()[-3000:])
        assert record is not None
        self.assertTrue(record.activated)
        self.assertIsNotNone(record.ek_certificate)  # swtpm's, from the anchor

        # the verifier gets V, the tenant checks the identity and sends U alone
        u_share, v_share = split(key)
        enrolment = EnrolmentRequest(
            node.uuid,
            v_share,
            self.policy,
            u_commitment=commit_u(node.uuid, u_share),
        )
        r = self.tenant_http.call(
            "POST", f"{self.cluster.verifier_url}/v1/nodes", json=enrolment.to_dict()
        )
        self.assertIn(r.status_code, (200, 201), r.text)

        async def send_u() -> bool:
            tenant = self.cluster.tenant()
            try:
                nk = await tenant.check_identity_quote(node.uuid, record, self.policy)
                return await tenant.send_u(node.uuid, record, nk, u_share, None)
            finally:
                await tenant.close()

        asyncio.run(send_u())
        text = wait_until(node.payload_output, 30, 0.2)
        self.assertEqual(f"payload ran on {node.uuid}\n", text)

    def test_anonymous_callers_get_401_except_registration(self) -> None:
        session = requests.Session()
        session.trust_env = False
        session.verify = self.cluster.pki_file("ca.pem")  # no client cert
        base = f"{self.cluster.registrar_url}/v1/agents"
        uuid = self.cluster.nodes[0].uuid
        for method, url in (
            ("GET", base),
            ("GET", f"{base}/{uuid}"),
            ("DELETE", f"{base}/{uuid}"),
            ("GET", f"{base}/{uuid}/ek"),
            ("PUT", f"{base}/{uuid}/ek"),
            ("DELETE", f"{base}/{uuid}/ek"),
        ):
            r = session.request(method, url, json={}, timeout=10)
            self.assertEqual(401, r.status_code, (method, url, r.text))
            self.assertEqual("unauthorized", r.json()["error"]["code"])
        # registration is open to anonymous callers, who must bring an EK
        # certificate (this body has none: refused before anything else)
        r = session.post(f"{base}/{uuid}", json={}, timeout=10)
        self.assertEqual(400, r.status_code, r.text)  # malformed body
