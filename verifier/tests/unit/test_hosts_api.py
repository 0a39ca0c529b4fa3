"""The compute host API (:mod:`verifier.api.hosts_app`) over a real
verifier service: the operator enrols, lists, shows and deletes hosts; a
project member is refused (403); bad bodies are JSON 400s naming the
field; a second claim is a 409 naming which; an unknown policy 404; the
Nova listener reports a node's host; a tenant's event listing never shows
a host's events."""

from __future__ import annotations

import dataclasses
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from oslo_context import context

from trusted_testing.auth import open_auth
from verifier.api.authz import Auth
from verifier.api.verifier_app import make_app, public_pem
from verifier.tests.unit.test_hosts_service import HostCase


@dataclasses.dataclass(frozen=True)
class MemberAuth(Auth):
    """Every caller is a reader and member of project ``p1``."""

    async def identify(self, request: web.Request) -> context.RequestContext | None:
        return context.RequestContext(
            user_id="u", project_id="p1", roles=["reader", "member"]
        )


class HostApiTest(HostCase):
    def client(self, auth: Auth | None = None) -> TestClient:
        if not self.verifiers:
            self.quiesce(self.new_verifier())
        app = make_app(
            self.verifiers[0], public_pem(self.public_key), auth or open_auth()
        )
        return TestClient(TestServer(app, host="127.0.0.1"))

    def body(self, uuid: str, **more: Any) -> dict[str, Any]:
        return {
            "provider": uuid,
            "hypervisor_hostname": "compute-1",
            "policy": self.policy.to_dict(),
            **more,
        }

    async def test_operator_enrols_lists_shows_and_deletes_a_host(self) -> None:
        host = self.new_agent()
        async with self.client() as client:
            resp = await client.post("/v1/hosts", json=self.body(host.uuid))
            created = await resp.json()
            self.assertEqual(201, resp.status, created)
            self.assertEqual(host.uuid, created["provider"])
            self.assertEqual("registered", created["state"])
            self.quiesce(self.verifiers[0])
            await self.verifiers[0].rounds.attest_once(host.uuid)
            listed = await (await client.get("/v1/hosts")).json()
            self.assertEqual(
                [("compute-1", "attested", True)],
                [
                    (h["hypervisor_hostname"], h["state"], h["trusted"])
                    for h in listed["hosts"]
                ],
            )
            shown = await (await client.get("/v1/hosts/compute-1")).json()
            self.assertEqual([], shown["guests"])
            resp = await client.delete(f"/v1/hosts/{host.uuid}")
            self.assertEqual(204, resp.status)
            resp = await client.get("/v1/hosts/compute-1")
            self.assertEqual(404, resp.status)
            self.assertEqual("unknown_host", (await resp.json())["error"]["code"])

    async def test_project_member_gets_403_on_every_host_operation(self) -> None:
        host = self.new_agent()
        async with self.client(MemberAuth(open_auth().enforcer)) as client:
            for method, url, body in (
                ("POST", "/v1/hosts", self.body(host.uuid)),
                ("GET", "/v1/hosts", None),
                ("GET", "/v1/hosts/compute-1", None),
                ("DELETE", "/v1/hosts/compute-1", None),
                ("PUT", f"/v1/nodes/{host.uuid}/host", {"host": "compute-1"}),
            ):
                with self.subTest(method=method, url=url):
                    resp = await client.request(method, url, json=body)
                    answer = await resp.json()
                    self.assertEqual(403, resp.status, answer)
                    self.assertEqual("forbidden", answer["error"]["code"])
        self.assertEqual([], await self.verifiers[0].hosts.list())

    async def test_bad_bodies_are_json_400_naming_the_field(self) -> None:
        host = self.new_agent()
        async with self.client() as client:
            for body, field in (
                ({**self.body(host.uuid), "colour": "red"}, "colour"),
                ({"hypervisor_hostname": "compute-1"}, "provider"),
                ({"provider": host.uuid}, "hypervisor_hostname"),
                (self.body(host.uuid, hypervisor_hostname=7), "hypervisor_hostname"),
                (self.body(host.uuid, runtime_policy=["x"]), "runtime_policy"),
                (self.body(host.uuid, ca_path="relative/ca.pem"), "ca_path"),
                (self.body(host.uuid, policy=None), "policy"),
                (self.body(host.uuid, interval=-1), "interval"),
                (self.body("not-a-uuid"), "not-a-uuid"),
                (
                    self.body(host.uuid, hypervisor_hostname="a b"),
                    "hypervisor_hostname",
                ),
            ):
                with self.subTest(field=field):
                    resp = await client.post("/v1/hosts", json=body)
                    answer = await resp.json()
                    self.assertEqual(400, resp.status, answer)
                    self.assertIn(field, answer["error"]["message"])
        self.assertEqual([], await self.verifiers[0].hosts.list())

    async def test_second_claim_is_409_naming_which(self) -> None:
        first, second = self.new_agent(), self.new_agent()
        async with self.client() as client:
            resp = await client.post("/v1/hosts", json=self.body(first.uuid))
            self.assertEqual(201, resp.status)
            for body, code in (
                (
                    self.body(first.uuid, hypervisor_hostname="compute-2"),
                    "provider_claimed",
                ),
                (self.body(second.uuid), "hypervisor_claimed"),
            ):
                with self.subTest(code=code):
                    resp = await client.post("/v1/hosts", json=body)
                    answer = await resp.json()
                    self.assertEqual(409, resp.status, answer)
                    self.assertEqual(code, answer["error"]["code"])

    async def test_unknown_policy_is_404(self) -> None:
        host = self.new_agent()
        async with self.client() as client:
            body = self.body(host.uuid, mb_policy="no-such-policy")
            resp = await client.post("/v1/hosts", json=body)
            answer = await resp.json()
            self.assertEqual(404, resp.status, answer)
            self.assertIn("no-such-policy", answer["error"]["message"])

    async def test_listener_reports_a_nodes_host(self) -> None:
        verifier = self.new_verifier()
        self.quiesce(verifier)
        guest = await self.attested_guest(verifier, host="compute-9")
        async with self.client() as client:
            resp = await client.put(
                f"/v1/nodes/{guest.uuid}/host", json={"host": "compute-1"}
            )
            self.assertEqual(200, resp.status, await resp.json())
            shown = await (await client.get(f"/v1/nodes/{guest.uuid}")).json()
            self.assertEqual("compute-1", shown["host"]["name"])
            resp = await client.put(
                f"/v1/nodes/{guest.uuid}/host", json={"host": "a/b"}
            )
            self.assertEqual(400, resp.status)
            resp = await client.put(
                "/v1/nodes/7d7ac7b4-0c5a-4d0e-9c57-4f4b0a0c0b0a/host",
                json={"host": "compute-1"},
            )
            self.assertEqual(404, resp.status)

    async def test_tenant_event_listing_never_shows_a_hosts_events(self) -> None:
        verifier = self.new_verifier()
        host = self.new_agent()
        await self.enrol_host(verifier, host)
        await verifier.rounds.attest_once(host.uuid)
        guest = await self.attested_guest(verifier)
        host.tpm.extend(16, b"unknown program")
        await verifier.rounds.attest_once(host.uuid)
        async with self.client(MemberAuth(open_auth().enforcer)) as client:
            events = (await (await client.get("/v1/events")).json())["events"]
            self.assertEqual(
                [(guest.uuid, "node.host_untrusted")],
                [(e["node_uuid"], e["type"]) for e in events],
            )
            listing = await (await client.get("/v1/nodes")).text()
            self.assertNotIn(host.uuid, listing)  # the provider is the operator's
            for url in (f"/v1/nodes/{host.uuid}", f"/v1/nodes/{host.uuid}/history"):
                with self.subTest(url=url):
                    resp = await client.get(url)
                    self.assertEqual(404, resp.status, await resp.text())
        async with self.client() as client:  # the operator sees the host's
            events = (await (await client.get("/v1/events")).json())["events"]
            self.assertIn(host.uuid, {e["node_uuid"] for e in events})

    async def test_nova_listener_tells_the_verifier_where_a_node_runs(self) -> None:
        import asyncio

        import oslo_messaging

        from verifier.nova_listener.listener import InstanceEndpoint, VerifierOperator

        verifier = self.new_verifier()
        self.quiesce(verifier)
        guest = await self.attested_guest(verifier, host="compute-1")
        async with self.client() as client:
            url = str(client.make_url("")).rstrip("/")
            endpoint = InstanceEndpoint(VerifierOperator(url, None))

            def notify(uuid: str, host: str) -> object:
                payload = {"nova_object.data": {"uuid": uuid, "host": host}}
                event = "instance.live_migration_post_dest.end"
                return endpoint.info({}, "nova-compute:x", event, payload, {})

            handled = oslo_messaging.NotificationResult.HANDLED
            result = await asyncio.to_thread(notify, guest.uuid, "compute-2")
            self.assertEqual(handled, result)
            shown = await (await client.get(f"/v1/nodes/{guest.uuid}")).json()
            self.assertEqual("compute-2", shown["host"]["name"])
            other = "7d7ac7b4-0c5a-4d0e-9c57-4f4b0a0c0b0a"  # nobody enrolled it
            self.assertEqual(handled, await asyncio.to_thread(notify, other, "c"))
