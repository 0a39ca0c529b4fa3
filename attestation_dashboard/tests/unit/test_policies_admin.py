"""The policies pages and the operator's page."""

from __future__ import annotations

from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from attestation_dashboard.tests.unit import base

POLICIES = reverse("horizon:project:attestation_policies:index")
UPLOAD = reverse("horizon:project:attestation_policies:upload")
ADMIN = reverse("horizon:admin:attestation:index")


def version(name: str, v: int, kind: str = "runtime") -> dict[str, object]:
    return {
        "kind": kind,
        "name": name,
        "version": v,
        "digest": f"{v:064x}",
        "entries": 3,
        "signed": False,
        "created_at": 1.7e9 + v,
    }


class PoliciesTest(base.ViewTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.route(
            "GET",
            "/policies/runtime",
            200,
            {"policies": [version("web", 1), version("web", 2)]},
        )
        self.route(
            "GET",
            "/policies/measured-boot",
            200,
            {"policies": [version("fw", 1, "measured-boot")]},
        )

    def test_lists_each_name_with_its_versions(self) -> None:
        res = self.client.get(POLICIES)
        self.assertEqual(200, res.status_code)
        html = res.content.decode()
        self.assertIn('id="policies__row__runtime:web"', html)
        self.assertIn('id="policies__row__measured-boot:fw"', html)
        self.assertIn('id="policies__action_upload"', html)
        self.assertIn("1, 2", html)

    def test_a_version_with_its_document_and_dry_run(self) -> None:
        url = reverse(
            "horizon:project:attestation_policies:detail", args=["runtime", "web"]
        )
        self.route(
            "GET",
            "/policies/runtime/web@1",
            200,
            {**version("web", 1), "policy": {"digests": {"/bin/sh": ["aa"]}}},
        )
        res = self.client.get(url + "?version=1")
        self.assertEqual(200, res.status_code)
        html = res.content.decode()
        self.assertIn('id="versions__row__2"', html)
        self.assertIn("/bin/sh", html)
        self.assertIn('id="dry-run"', html)
        self.route(
            "POST",
            "/policies/runtime/web@1/check",
            200,
            {
                "policy": {"name": "web", "version": 1, "digest": "0" * 64},
                "results": [
                    {
                        "node": base.NODE,
                        "result": "fail",
                        "entries": 9,
                        "failures": [
                            {
                                "index": 4,
                                "path": "/usr/bin/evil",
                                "reason": "not_allowed",
                                "detail": "",
                            }
                        ],
                        "failures_total": 1,
                        "error": None,
                    }
                ],
            },
        )
        res = self.client.post(url, {"dry_run": "1", "version": "1"})
        self.assertEqual(200, res.status_code)
        html = res.content.decode()
        self.assertIn('id="dry-run-results"', html)
        self.assertIn("/usr/bin/evil", html)
        checks = [c for c in self.api.calls if c["path"].endswith("/check")]
        self.assertEqual({"all": True}, checks[0]["body"])

    def test_an_upload_that_is_not_json_names_line_and_column(self) -> None:
        bad = SimpleUploadedFile("p.json", b'{\n  "digests": {\n    "a": [1,]\n}')
        res = self.client.post(
            UPLOAD, {"kind": "runtime", "name": "web", "policy_file": bad}
        )
        self.assertEqual(200, res.status_code)
        errors = res.context["form"].errors["policy_file"]
        self.assertEqual(1, len(errors))
        self.assertTrue(errors[0].startswith("not JSON: line 3 column 13: "), errors[0])
        self.assertEqual([], [c for c in self.api.calls if c["method"] == "POST"])

    def test_an_upload_posts_the_document_under_its_name(self) -> None:
        self.route("POST", "/policies/runtime", 201, version("web", 3))
        good = SimpleUploadedFile("p.json", b'{"digests": {"/bin/sh": ["aa"]}}')
        res = self.client.post(
            UPLOAD, {"kind": "runtime", "name": "web", "policy_file": good}
        )
        self.assertNoFormErrors(res)
        posts = [c for c in self.api.calls if c["method"] == "POST"]
        self.assertEqual(
            {"policy": {"digests": {"/bin/sh": ["aa"]}}, "name": "web"},
            posts[0]["body"],
        )

    def test_the_apis_refusal_is_a_form_error(self) -> None:
        self.route(
            "POST",
            "/policies/runtime",
            400,
            {"error": {"code": "bad_policy", "message": "digests: not hex"}},
        )
        good = SimpleUploadedFile("p.json", b'{"digests": {"/bin/sh": ["zz"]}}')
        res = self.client.post(
            UPLOAD, {"kind": "runtime", "name": "web", "policy_file": good}
        )
        self.assertIn("digests: not hex", res.content.decode())


class AdminTest(base.ViewTestCase):
    user_roles = ("admin", "member", "reader")

    def test_the_fleet_stats_hosts_and_revocations(self) -> None:
        self.route(
            "GET",
            "/nodes",
            200,
            {"nodes": [base.node(), base.node(base.OTHER, "revoked", project_id="2")]},
        )
        self.route(
            "GET",
            "/stats",
            200,
            {
                "nodes": 2,
                "states": {"attested": 1, "revoked": 1},
                "quotes_verified": 9,
                "classes": [
                    {"interval": 2.0, "rounds": 5, "lag_mean": 0.01, "lag_max": 0.05}
                ],
                "outbox": {"pending": 1, "oldest_pending_age": 3.0},
            },
        )
        self.route(
            "GET",
            "/hosts",
            200,
            {
                "hosts": [
                    {
                        "uuid": "p1",
                        "provider": "p1",
                        "hypervisor_hostname": "compute-1",
                        "state": "attested",
                        "trusted": True,
                        "failure_reason": None,
                        "as_of": "2026-11-29T07:00:00Z",
                        "last_attested_at": None,
                    }
                ]
            },
        )
        self.route(
            "GET",
            "/events",
            200,
            {
                "events": [
                    {
                        "id": "e1",
                        "node_uuid": base.OTHER,
                        "type": "node.revoked",
                        "reason": "tenant_revoked",
                        "detail": "by hand",
                        "created_at": "2026-11-29T07:02:00Z",
                    }
                ],
                "links": [],
            },
        )
        res = self.client.get(ADMIN)
        self.assertEqual(200, res.status_code)
        html = res.content.decode()
        self.assertIn('id="fleet__row__' + base.OTHER, html)
        self.assertIn('<svg id="state-chart"', html)
        self.assertIn('id="verifier-stats"', html)
        self.assertIn('id="hosts__row__p1"', html)
        self.assertIn('id="revocations__row__e1"', html)
        self.assertIn("tenant_revoked", html)
        events = [c for c in self.api.calls if c["path"] == "/v1/events"]
        self.assertIn("kind=revoked", events[0]["query"])

    def test_api_down_is_one_line_for_the_whole_page(self) -> None:
        from attestation_dashboard.tests.unit.fakeapi import closed_port_url

        self.api_url = closed_port_url()
        self._setup_test_data()
        self._setup_user()
        res = self.client.get(ADMIN)
        self.assertEqual(200, res.status_code)
        self.assertEqual(
            ["The attestation service cannot be reached: connection refused."],
            self.messages_of(res),
        )
