"""The project's node pages: the table, a node's page, the actions."""

from __future__ import annotations

from django.urls import reverse

from attestation_dashboard.tests.unit import base
from attestation_dashboard.tests.unit.fakeapi import closed_port_url

INDEX = reverse("horizon:project:attestation_nodes:index")


def detail(uuid: str) -> str:
    return reverse("horizon:project:attestation_nodes:detail", args=[uuid])


class NodesIndexTest(base.ViewTestCase):
    def test_lists_the_nodes_with_their_columns_and_a_chart(self) -> None:
        self.route(
            "GET",
            "/nodes",
            200,
            {"nodes": [base.node(), base.node(base.OTHER, "revoked")]},
        )
        res = self.client.get(INDEX)
        self.assertEqual(200, res.status_code)
        html = res.content.decode()
        self.assertIn(f'id="nodes__row__{base.NODE}"', html)
        self.assertIn(f'id="nodes__row__{base.OTHER}"', html)
        self.assertIn('<svg id="state-chart"', html)
        self.assertIn('data-state="revoked" data-count="1"', html)
        self.assertIn("web v2 (follows)", html)
        self.assertIn("trusted (compute-1)", html)
        self.assertIn("12 s ago", html)
        for action in ("change_policy", "revoke", "delete"):
            self.assertIn(f'id="nodes__row_{base.NODE}__action_{action}"', html)
        # a revoked node cannot be revoked again nor change policy
        self.assertNotIn(f'id="nodes__row_{base.OTHER}__action_revoke"', html)
        self.assertIn(f'id="nodes__row_{base.OTHER}__action_delete"', html)
        # the user's own token, never another credential
        self.assertEqual(self.token.id, self.api.calls[0]["token"])

    def test_api_down_says_so_in_one_line_with_an_empty_table(self) -> None:
        self.api_url = closed_port_url()
        self._setup_test_data()
        self._setup_user()
        res = self.client.get(INDEX)
        self.assertEqual(200, res.status_code)
        said = self.messages_of(res)
        self.assertEqual(
            ["The attestation service cannot be reached: connection refused."], said
        )
        self.assertIn("No items to display", res.content.decode())

    def test_no_endpoint_in_the_catalog_is_one_line(self) -> None:
        self.service_catalog = [
            s for s in self.service_catalog if s["type"] != "attestation"
        ]
        self._setup_user()
        res = self.client.get(INDEX)
        self.assertEqual(200, res.status_code)
        self.assertEqual(
            [
                "The attestation service cannot be reached: no 'attestation' "
                "endpoint in the service catalog."
            ],
            self.messages_of(res),
        )
        self.assertEqual([], self.api.calls)

    def test_a_server_error_counts_as_unreachable(self) -> None:
        self.route("GET", "/nodes", 503, {"error": {"code": "x", "message": "busy"}})
        res = self.client.get(INDEX)
        self.assertEqual(200, res.status_code)
        self.assertEqual(
            [
                "The attestation service cannot be reached: "
                "the API answered 503 Service Unavailable."
            ],
            self.messages_of(res),
        )

    def test_api_forbidden_is_horizons_not_authorized(self) -> None:
        self.route(
            "GET", "/nodes", 403, {"error": {"code": "forbidden", "message": "no"}}
        )
        res = self.client.get(INDEX)
        self.assertEqual(403, res.status_code)
        self.assertTemplateUsed(res, "not_authorized.html")


class ReaderTest(base.ViewTestCase):
    user_roles = ("reader",)

    def test_a_reader_sees_no_action(self) -> None:
        self.route("GET", "/nodes", 200, {"nodes": [base.node()]})
        res = self.client.get(INDEX)
        self.assertEqual(200, res.status_code)
        html = res.content.decode()
        self.assertIn(f'id="nodes__row__{base.NODE}"', html)
        self.assertNotIn("__action_", html.replace("__action_filter", ""))

    def test_a_reader_posting_an_action_gets_nothing_done(self) -> None:
        self.route("GET", "/nodes", 200, {"nodes": [base.node()]})
        res = self.client.post(INDEX, {"action": f"nodes__revoke__{base.NODE}"})
        self.assertIn(res.status_code, (302, 200, 403))
        self.assertEqual([], [c for c in self.api.calls if c["method"] == "POST"])


class NodeActionsTest(base.ViewTestCase):
    def test_revoke_calls_the_api_as_the_user(self) -> None:
        self.route("GET", "/nodes", 200, {"nodes": [base.node()]})
        self.route(
            "POST", f"/nodes/{base.NODE}/revoke", 200, base.node(state="revoked")
        )
        res = self.client.post(INDEX, {"action": f"nodes__revoke__{base.NODE}"})
        self.assertEqual(302, res.status_code)
        posts = [c for c in self.api.calls if c["method"] == "POST"]
        self.assertEqual(f"/v1/nodes/{base.NODE}/revoke", posts[0]["path"])
        self.assertIn("revoked from the dashboard", posts[0]["body"]["detail"])
        self.assertEqual(self.token.id, posts[0]["token"])

    def test_delete_calls_the_api(self) -> None:
        self.route("GET", "/nodes", 200, {"nodes": [base.node()]})
        self.route("DELETE", f"/nodes/{base.NODE}", 204, None)
        res = self.client.post(INDEX, {"action": f"nodes__delete__{base.NODE}"})
        self.assertEqual(302, res.status_code)
        self.assertIn(
            ("DELETE", f"/v1/nodes/{base.NODE}"),
            [(c["method"], c["path"]) for c in self.api.calls],
        )

    def test_change_policy_form_offers_the_versions_and_puts_the_change(self) -> None:
        url = reverse(
            "horizon:project:attestation_nodes:change_policy", args=[base.NODE]
        )
        self.route("GET", f"/nodes/{base.NODE}", 200, base.node())
        self.route(
            "GET",
            "/policies/runtime",
            200,
            {
                "policies": [
                    {
                        "kind": "runtime",
                        "name": "web",
                        "version": 1,
                        "digest": "a" * 64,
                        "entries": 3,
                        "signed": False,
                        "created_at": 1.0e9,
                    },
                    {
                        "kind": "runtime",
                        "name": "web",
                        "version": 2,
                        "digest": "b" * 64,
                        "entries": 4,
                        "signed": False,
                        "created_at": 1.1e9,
                    },
                ]
            },
        )
        self.route("GET", "/policies/measured-boot", 200, {"policies": []})
        res = self.client.get(url)
        self.assertEqual(200, res.status_code)
        html = res.content.decode()
        self.assertIn('value="web@1"', html)
        self.assertIn("web:2", html)
        self.route("PUT", f"/nodes/{base.NODE}/policy", 200, base.node())
        res = self.client.post(
            url, {"node_id": base.NODE, "runtime_policy": "web@1", "mb_policy": ""}
        )
        self.assertNoFormErrors(res)
        puts = [c for c in self.api.calls if c["method"] == "PUT"]
        self.assertEqual({"runtime_policy": "web@1"}, puts[0]["body"])


class NodeDetailTest(base.ViewTestCase):
    def test_shows_state_reason_events_and_a_timeline(self) -> None:
        self.route(
            "GET",
            f"/nodes/{base.NODE}",
            200,
            base.node(
                state="revoked", failure_reason="ima_policy: /usr/bin/evil not allowed"
            ),
        )
        self.route(
            "GET",
            "/events",
            200,
            {
                "events": [
                    {
                        "id": "e1",
                        "node_uuid": base.NODE,
                        "type": "node.revoked",
                        "reason": "ima_policy",
                        "detail": "/usr/bin/evil not allowed",
                        "created_at": "2026-11-29T07:01:00Z",
                    }
                ],
                "links": [],
            },
        )
        entry = {
            "prev": None,
            "node_uuid": base.NODE,
            "project_id": "1",
            "detail": "",
            "event_id": None,
        }
        self.route(
            "GET",
            f"/nodes/{base.NODE}/history",
            200,
            {
                "entries": [
                    {
                        "entry": {
                            **entry,
                            "index": 0,
                            "kind": "attested",
                            "reason": "ok",
                            "created_at": 1.7e9,
                        },
                        "proof": [],
                    },
                    {
                        "entry": {
                            **entry,
                            "index": 1,
                            "kind": "revoked",
                            "reason": "ima_policy",
                            "created_at": 1.7e9 + 60,
                        },
                        "proof": [],
                    },
                ]
            },
        )
        res = self.client.get(detail(base.NODE))
        self.assertEqual(200, res.status_code)
        html = res.content.decode()
        self.assertIn('<dd id="node-state">revoked</dd>', html)
        self.assertIn("ima_policy: /usr/bin/evil not allowed", html)
        self.assertIn('id="events"', html)
        self.assertIn("/usr/bin/evil not allowed", html)
        self.assertIn('<svg id="quote-timeline"', html)
        self.assertIn('class="point verified"', html)
        self.assertIn('class="point failed"', html)
        events = [c for c in self.api.calls if c["path"] == "/v1/events"]
        self.assertIn(f"node={base.NODE}", events[0]["query"])

    def test_a_node_the_api_does_not_know_is_horizons_not_found(self) -> None:
        res = self.client.get(detail(base.UNKNOWN))
        self.assertEqual(404, res.status_code)

    def test_forbidden_is_not_authorized(self) -> None:
        self.route(
            "GET",
            f"/nodes/{base.NODE}",
            403,
            {"error": {"code": "forbidden", "message": "policy"}},
        )
        res = self.client.get(detail(base.NODE))
        self.assertEqual(403, res.status_code)

    def test_api_down_on_the_node_page_is_one_line(self) -> None:
        self.api_url = closed_port_url()
        self._setup_test_data()
        self._setup_user()
        res = self.client.get(detail(base.NODE))
        self.assertEqual(200, res.status_code)
        self.assertEqual(
            ["The attestation service cannot be reached: connection refused."],
            self.messages_of(res),
        )
