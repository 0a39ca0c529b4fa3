"""Enrolment ahead of the instance (boot through Nova) and the Nova
notification listener's calls, against real registrar and verifier
processes and an agent on swtpm: pending -> created (operator only) ->
registered once the agent's AK is activated -> attested; unenrolment by
the operator; duplicates and unknown nodes."""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import tempfile
import uuid as uuid_mod

import oslo_messaging
import testtools

from nova_plugin.exceptions import ServiceError
from trusted_testing.cluster import PCR, LocalCluster, wait_until
from trusted_testing.e2e import Http
from verifier.common import tls as tlsutil
from verifier.nova_listener import InstanceEndpoint, VerifierOperator
from verifier.protocol import PcrPolicy, generate_key, split


def _payload(uuid: str) -> dict:  # type: ignore[type-arg]
    return {
        "nova_object.name": "InstanceCreatePayload",
        "nova_object.data": {"uuid": uuid},
    }


class EnrolAheadTest(testtools.TestCase):
    cluster: LocalCluster

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.tmp = tempfile.mkdtemp(prefix="enrol-ahead-")
        cls.cluster = LocalCluster(os.path.join(cls.tmp, "c"), nodes=0, interval=0.3)
        try:
            cls.cluster.start()
        except Exception:
            cls.cluster.stop()
            raise
        cls.tenant_http = Http(cls.cluster, "tenant")
        cls.operator_http = Http(cls.cluster, "operator")
        cls.policy = PcrPolicy.from_dict(
            {"pcrs": {str(PCR): [cls.cluster.good_pcr_hex()]}}
        )
        context = tlsutil.client_context(
            cls.cluster.pki_file("operator.pem"),
            cls.cluster.pki_file("operator-key.pem"),
            cls.cluster.pki_file("ca.pem"),
        )
        cls.endpoint = InstanceEndpoint(
            VerifierOperator(cls.cluster.verifier_url, context)
        )

    @classmethod
    def tearDownClass(cls) -> None:
        try:
            cls.cluster.stop()
        finally:
            shutil.rmtree(cls.tmp, ignore_errors=True)
            super().tearDownClass()

    def enrol_ahead(self, uuid: str) -> dict:  # type: ignore[type-arg]
        async def go() -> dict:  # type: ignore[type-arg]
            tenant = self.cluster.tenant()
            try:
                return dict(
                    await tenant.enrol_ahead(
                        uuid, split(generate_key())[1], self.policy, bytes(32)
                    )
                )
            finally:
                await tenant.close()

        return asyncio.run(go())

    def state(self, uuid: str) -> str | None:
        r = self.tenant_http.call("GET", f"{self.cluster.verifier_url}/v1/nodes/{uuid}")
        return str(r.json()["state"]) if r.status_code == 200 else None

    def info(self, event: str, uuid: str) -> object:
        return self.endpoint.info({}, "nova-compute:host", event, _payload(uuid), {})

    def test_pending_node_is_not_polled_until_created_then_attested(self) -> None:
        uuid = str(uuid_mod.uuid4())
        self.assertEqual("pending", self.enrol_ahead(uuid)["state"])
        node = self.cluster.add_node(uuid)  # the agent registers its AK
        self.assertTrue(wait_until(lambda: node.proc is not None, 5))
        r = self.tenant_http.call(
            "GET", f"{self.cluster.registrar_url}/v1/agents/{uuid}"
        )
        self.assertTrue(
            wait_until(
                lambda: (
                    self.tenant_http.call(
                        "GET", f"{self.cluster.registrar_url}/v1/agents/{uuid}"
                    )
                    .json()
                    .get("activated")
                ),
                30,
            ),
            r.text,
        )
        # registered and activated, but Nova has not said the instance exists
        asyncio.run(asyncio.sleep(1.0))
        self.assertEqual("pending", self.state(uuid))
        result = self.info("instance.create.end", uuid)
        self.assertEqual(oslo_messaging.NotificationResult.HANDLED, result)
        self.assertTrue(
            wait_until(lambda: self.state(uuid) == "attested", 20), self.state(uuid)
        )

    def test_only_the_operator_marks_an_instance_created(self) -> None:
        uuid = str(uuid_mod.uuid4())
        self.enrol_ahead(uuid)
        url = f"{self.cluster.verifier_url}/v1/nodes/{uuid}/instance-created"
        r = self.tenant_http.call("POST", url)
        self.assertEqual(403, r.status_code)
        self.assertEqual("forbidden", r.json()["error"]["code"])
        self.assertEqual("pending", self.state(uuid))
        r = self.operator_http.call("POST", url)
        self.assertEqual(200, r.status_code, r.text)
        self.assertEqual("created", r.json()["state"])
        # idempotent: a redelivered event changes nothing
        self.assertEqual(
            "created", self.operator_http.call("POST", url).json()["state"]
        )

    def test_instance_delete_end_unenrols(self) -> None:
        uuid = str(uuid_mod.uuid4())
        self.enrol_ahead(uuid)
        self.info("instance.create.end", uuid)
        self.assertEqual("created", self.state(uuid))
        result = self.info("instance.delete.end", uuid)
        self.assertEqual(oslo_messaging.NotificationResult.HANDLED, result)
        self.assertIsNone(self.state(uuid))

    def test_events_of_instances_nobody_enrolled_are_ignored(self) -> None:
        uuid = str(uuid_mod.uuid4())
        for event in ("instance.create.end", "instance.delete.end"):
            self.assertEqual(
                oslo_messaging.NotificationResult.HANDLED, self.info(event, uuid)
            )
        self.assertIsNone(self.state(uuid))

    def test_event_is_requeued_while_the_verifier_is_unreachable(self) -> None:
        endpoint = InstanceEndpoint(VerifierOperator("https://127.0.0.1:9", None, 2.0))
        result = endpoint.info(
            {}, "p", "instance.delete.end", _payload(str(uuid_mod.uuid4())), {}
        )
        self.assertEqual(oslo_messaging.NotificationResult.REQUEUE, result)

    def test_duplicate_enrolment_is_refused_and_the_first_kept(self) -> None:
        uuid = str(uuid_mod.uuid4())
        first = self.enrol_ahead(uuid)
        exc = self.assertRaises(ServiceError, self.enrol_ahead, uuid)
        self.assertEqual(409, exc.status)
        self.assertEqual("already_enrolled", exc.code)
        self.assertEqual(first["state"], self.state(uuid))

    def test_tenant_cannot_use_a_wrong_await_instance_value(self) -> None:
        body = {
            "uuid": str(uuid_mod.uuid4()),
            "v": base64.b64encode(bytes(32)).decode(),
            "u_commitment": base64.b64encode(bytes(32)).decode(),
            "policy": self.policy.to_dict(),
            "await_instance": "yes",
        }
        r = self.tenant_http.call(
            "POST", f"{self.cluster.verifier_url}/v1/nodes", json=body
        )
        self.assertEqual(400, r.status_code)
        self.assertIn("await_instance", r.json()["error"]["message"])

    def test_listener_tells_the_verifier_the_instances_host_over_mtls(self) -> None:
        # the operator certificate (the service role) reports the host
        uuid = str(uuid_mod.uuid4())
        self.enrol_ahead(uuid)
        payload = {"nova_object.data": {"uuid": uuid, "host": "compute-1"}}
        result = self.endpoint.info(
            {}, "nova-compute:compute-1", "instance.create.end", payload, {}
        )
        self.assertEqual(oslo_messaging.NotificationResult.HANDLED, result)
        url = f"{self.cluster.verifier_url}/v1/nodes/{uuid}"
        shown = self.tenant_http.call("GET", url).json()
        self.assertEqual("compute-1", shown["host"]["name"])
        self.assertIsNone(shown["host"]["trusted"])  # no such host enrolled
        # a tenant may not say where its node runs
        r = self.tenant_http.call("PUT", url + "/host", json={"host": "compute-2"})
        self.assertEqual(403, r.status_code)
