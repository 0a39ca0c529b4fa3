"""A compute host attested by the real verifier process (LocalCluster, no
Nova): a node agent on its own swtpm registers under a provider UUID and
is enrolled by the operator as host ``compute-1``; a tenant's node runs on
it. Something unknown is measured on the host: the host is revoked, its
trait and trust go, and the tenant's node becomes ``host_untrusted`` with
a signed ``node.host_untrusted`` event delivered to the hooks."""

from __future__ import annotations

from typing import Any, ClassVar

from trusted_testing.cluster import wait_until
from trusted_testing.cluster_case import ClusterTestCase
from trusted_testing.e2e import Http
from verifier.protocol import PcrPolicy

PAYLOAD = b"#!/bin/sh\ntrue\n"


class ComputeHostTest(ClusterTestCase):
    prefix: ClassVar[str] = "compute-hosts-"
    node_count: ClassVar[int] = 2  # the host, and a tenant's node on it
    interval: ClassVar[float] = 0.3

    def host(self, operator: Http) -> dict[str, Any]:
        url = f"{self.cluster.verifier_url}/v1/hosts/compute-1"
        return dict(operator.call("GET", url).json())

    def test_host_failing_marks_the_tenants_node_host_untrusted(self) -> None:
        host, guest = self.cluster.nodes
        operator = Http(self.cluster, "operator")
        policy = PcrPolicy.from_dict({"pcrs": {"16": [self.cluster.good_pcr_hex()]}})
        body = {
            "provider": host.uuid,
            "hypervisor_hostname": "compute-1",
            "policy": policy.to_dict(),
        }
        url = f"{self.cluster.verifier_url}/v1/hosts"
        tenant = Http(self.cluster, "tenant")
        r = tenant.call("POST", url, json=body)
        self.assertEqual(403, r.status_code, r.text)
        r = operator.call("POST", url, json=body)
        self.assertEqual(201, r.status_code, r.text)
        wait_until(lambda: self.host(operator)["trusted"] is True, 20, what="host")
        self.run_async(self.tenant.enrol(guest.uuid, PAYLOAD, policy))
        self.wait_for(guest.uuid, lambda s: s["state"] == "attested")
        place = f"{self.cluster.verifier_url}/v1/nodes/{guest.uuid}/host"
        r = operator.call("PUT", place, json={"host": "compute-1"})
        self.assertEqual(200, r.status_code, r.text)
        self.assertIs(True, self.status(guest.uuid)["host"]["trusted"])
        self.assertEqual([guest.uuid], self.host(operator)["guests"])

        self.cluster.tamper(host)  # an unknown program runs on the host
        shown = self.wait_for(guest.uuid, lambda s: s["state"] == "host_untrusted")
        self.assertEqual("host_untrusted", shown["state"], shown)
        self.assertIs(False, shown["host"]["trusted"])
        self.assertEqual("revoked", self.host(operator)["state"])
        events = self.run_async(self.tenant.events(guest.uuid))
        self.assertEqual(
            ["node.host_untrusted"],
            [e["type"] for e in events if e["type"] != "node.policy_changed"],
        )
        wait_until(
            lambda: any(
                (r.get("node_uuid"), r.get("type"))
                == (guest.uuid, "node.host_untrusted")
                for r in self.cluster.hook_records()
            ),
            20,
            what="the hooks acted on the guest",
        )
