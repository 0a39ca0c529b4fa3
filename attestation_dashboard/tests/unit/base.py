"""The views' test case: Horizon's helpers (a logged-in user of the test
data's project) with an ``attestation`` entry in the user's catalog that
points at a :class:`FakeApi` on loopback."""

from __future__ import annotations

import copy
from typing import Any

from openstack_dashboard.test import helpers
from urllib3.connection import HTTPConnection

from attestation_dashboard.tests.unit.fakeapi import FakeApi

NODE = "0b8e1b2a-6f6c-4e3e-9b7a-1f2e3d4c5b6a"
OTHER = "9d1c2b3a-4e5f-4a6b-8c7d-0e1f2a3b4c5d"
UNKNOWN = "11111111-2222-4333-8444-555555555555"


def node(uuid: str = NODE, state: str = "attested", **extra: Any) -> dict[str, Any]:
    data = {
        "uuid": uuid,
        "state": state,
        "policy": {},
        "failure_reason": None,
        "last_attested_at": "2026-11-29T07:00:00Z",
        "last_attested_age": 12.0,
        "trusted": state == "attested",
        "quotes_verified": 7,
        "runtime_policy": "ab" * 32,
        "mb_policy": None,
        "ima_entries": 10,
        "project_id": "1",
        "mode": "pull",
        "interval": None,
        "host": {"name": "compute-1", "trusted": True, "as_of": "2026-11-29T07:00:00Z"},
        "policies": {
            "runtime": {
                "name": "web",
                "version": 2,
                "digest": "ab" * 32,
                "follows": True,
            },
            "measured-boot": None,
        },
    }
    data.update(extra)
    return data


class ViewTestCase(helpers.TestCase):
    """A Horizon view test against a loopback API."""

    user_roles = ("member", "reader")

    def setUp(self) -> None:
        self.api = FakeApi()
        self.addCleanup(self.api.stop)
        self.api_url = self.api.url
        super().setUp()
        # Horizon's helpers fail a test on any real connection: ours go to
        # the loopback API only, anything else still fails the test
        real, guard = self._real_conn_request, self.fake_conn_request

        def connect(conn: Any) -> Any:
            if conn.host == "127.0.0.1":
                return real(conn)
            return guard()

        HTTPConnection.connect = connect  # type: ignore[method-assign]

    def _setup_test_data(self) -> None:
        super()._setup_test_data()
        self.service_catalog = copy.deepcopy(self.service_catalog)
        self.service_catalog.append(
            {
                "type": "attestation",
                "name": "attestation",
                "endpoints_links": [],
                "endpoints": [
                    {"region": region, "interface": face, "url": self.api_url}
                    for region in ("RegionOne", "RegionTwo")
                    for face in ("admin", "internal", "public")
                ],
            }
        )

    def _setup_user(self, **kwargs: Any) -> None:
        roles = [{"id": str(i), "name": r} for i, r in enumerate(self.user_roles)]
        super()._setup_user(roles=roles, **kwargs)

    def route(self, method: str, path: str, status: int, body: Any) -> None:
        self.api.routes[(method, "/v1" + path)] = (status, body)

    def messages_of(self, response: Any) -> list[str]:
        return (
            [str(m) for m in response.context["messages"]] if response.context else []
        )
