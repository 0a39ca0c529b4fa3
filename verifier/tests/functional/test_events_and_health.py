"""Events you can query, and health and stats as promised (issue 30
items 3 and 4), against the real registrar and verifier processes of a
``noauth`` deployment (:class:`~trusted_testing.cluster.LocalCluster`, no
nodes) on 127.0.0.1.

The events are staged in the verifier's own database, signed with its own
event key, with times the test chooses; the verifier process lists them.
``trusted-tenant events`` runs as a child process with the deployment's
tenant certificate.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, ClassVar

import requests
import testtools
from sqlalchemy.orm import Session

from trusted_testing.cluster import LocalCluster
from verifier.cmd.verifier import load_signing_key
from verifier.db import make_engine
from verifier.notify.outbox import add_to_outbox, make_event
from verifier.protocol.events import NODE_RECOVERED, NODE_REVOKED, NODE_UNREACHABLE

NODE_A = "0f1e2d3c-4b5a-4968-8776-655443322110"
NODE_B = "1f1e2d3c-4b5a-4968-8776-655443322111"
OTHER = "2f1e2d3c-4b5a-4968-8776-655443322112"
_TENANT = os.path.join(os.path.dirname(sys.executable), "trusted-tenant")


class EventsAndHealthTest(testtools.TestCase):
    tmp: ClassVar[str]
    cluster: ClassVar[LocalCluster]
    ids: ClassVar[dict[str, str]]

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.tmp = tempfile.mkdtemp(prefix="events-health-")
        cls.cluster = LocalCluster(os.path.join(cls.tmp, "cluster"), nodes=0)
        try:
            cls.cluster.start_services()
            cls.ids = cls._stage_events()
        except Exception:
            cls.cluster.stop()
            shutil.rmtree(cls.tmp, ignore_errors=True)
            raise

    @classmethod
    def tearDownClass(cls) -> None:
        cls.cluster.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)
        super().tearDownClass()

    @classmethod
    def _stage_events(cls) -> dict[str, str]:
        """Events of the tenant's nodes an hour and a few minutes ago (two
        at the very same time), and one of another project."""
        key = load_signing_key(
            os.path.join(cls.cluster.workdir, "event-signing-key.pem")
        )
        engine = make_engine(cls.cluster.database_url)
        now = time.time()
        staged = {
            "old": (NODE_A, now - 7200, NODE_REVOKED, "pcr_policy", "tenant"),
            "gone": (NODE_A, now - 600, NODE_UNREACHABLE, "unreachable", "tenant"),
            "back": (NODE_A, now - 300, NODE_RECOVERED, "recovered", "tenant"),
            "tie1": (NODE_B, now - 120, NODE_REVOKED, "ima_policy", "tenant"),
            "tie2": (NODE_B, now - 120, NODE_REVOKED, "ima_policy", "tenant"),
            "other": (OTHER, now - 60, NODE_REVOKED, "pcr_policy", "other"),
        }
        ids = {}
        try:
            with Session(engine) as session, session.begin():
                for name, (node, at, kind, reason, project) in staged.items():
                    signed = make_event(key, node, reason, f"{name} detail", at, kind)
                    add_to_outbox(session, signed, at, project)
                    ids[name] = signed.event.id
        finally:
            engine.dispose()
        return ids

    def _session(self, who: str | None = "tenant") -> requests.Session:
        session = requests.Session()
        session.trust_env = False  # loopback only, never a proxy
        if who is not None:
            session.cert = (
                self.cluster.pki_file(f"{who}.pem"),
                self.cluster.pki_file(f"{who}-key.pem"),
            )
        session.verify = self.cluster.pki_file("ca.pem")
        return session

    def _get(self, path: str, who: str | None = "tenant") -> requests.Response:
        with self._session(who) as session:
            return session.get(self.cluster.verifier_url + path, timeout=10)

    def _tenant(self, *argv: str) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, **self.cluster.tenant_env())
        return subprocess.run(
            [_TENANT, *argv], env=env, capture_output=True, text=True, timeout=60
        )

    # -- item 4: health and stats --------------------------------------------

    def test_healthcheck_answers_a_client_without_certificate(self) -> None:
        for url in (self.cluster.verifier_url, self.cluster.registrar_url):
            with self._session(None) as session:
                resp = session.get(url + "/healthcheck", timeout=10)
            self.assertEqual((200, "OK"), (resp.status_code, resp.text), url)

    def test_api_refuses_a_client_without_certificate(self) -> None:
        for path in ("/v1/nodes", "/v1/events", "/v1/stats", "/v1/policies/runtime"):
            resp = self._get(path, None)
            self.assertEqual(401, resp.status_code, path)
            self.assertEqual("unauthorized", resp.json()["error"]["code"], path)

    def test_stats_need_the_operator_certificate(self) -> None:
        resp = self._get("/v1/stats", "operator")
        self.assertEqual(200, resp.status_code, resp.text)
        self.assertIn("states", resp.json())
        # the outbox's undelivered events, as the listing marks them
        events = self._get("/v1/events?limit=1000", "operator").json()["events"]
        pending = [e for e in events if not e["delivered"]]
        outbox = resp.json()["outbox"]
        self.assertEqual(len(pending), outbox["pending"])
        self.assertEqual(pending == [], outbox["oldest_pending_age"] is None)
        resp = self._get("/v1/stats", "tenant")
        self.assertEqual(403, resp.status_code, resp.text)

    # -- item 3: events you can query ------------------------------------------

    def test_filters_newest_first_with_the_detail(self) -> None:
        resp = self._get(f"/v1/events?node={NODE_A}")
        self.assertEqual(200, resp.status_code, resp.text)
        events = resp.json()["events"]
        self.assertEqual(
            [self.ids["back"], self.ids["gone"], self.ids["old"]],
            [e["id"] for e in events],
        )
        self.assertEqual(
            ("node.unreachable", "unreachable", "gone detail"),
            (events[1]["type"], events[1]["reason"], events[1]["detail"]),
        )
        resp = self._get("/v1/events?kind=unreachable")
        self.assertEqual([self.ids["gone"]], [e["id"] for e in resp.json()["events"]])
        since = events[1]["created_at"]  # the unreachable one, inclusive
        resp = self._get(f"/v1/events?node={NODE_A}&since={since}")
        self.assertEqual(2, len(resp.json()["events"]))

    def test_pages_follow_links_across_equal_times(self) -> None:
        seen, path, pages = [], "/v1/events?limit=2", 0
        while path:
            body = self._get(path).json()
            pages += 1
            seen += [e["id"] for e in body["events"]]
            path = body["links"][0]["href"] if body["links"] else ""
        mine = {k: v for k, v in self.ids.items() if k != "other"}
        self.assertEqual((3, sorted(mine.values())), (pages, sorted(seen)))

    def test_bad_query_is_a_json_400_naming_the_parameter(self) -> None:
        for query, name in (
            ("since=2026-11-27T20:00:00", "since"),
            ("limit=1001", "limit"),
            ("kind=exploded", "kind"),
            (f"marker={self.ids['other']}", "marker"),  # another project's
        ):
            resp = self._get("/v1/events?" + query)
            self.assertEqual(400, resp.status_code, query)
            self.assertIn(f"'{name}'", resp.json()["error"]["message"], query)

    def test_tenant_cli_since_an_hour_ago_every_page(self) -> None:
        done = self._tenant(
            "--json", "events", "--since", "1h", "--limit", "1", "--all"
        )
        self.assertEqual(0, done.returncode, done.stderr)
        listed: Any = json.loads(done.stdout)
        ids = [e["id"] for e in listed["events"]]
        self.assertEqual(4, len(ids))  # not the old one, not another project's
        self.assertNotIn(self.ids["old"], ids)
        self.assertEqual([], listed["links"])
        done = self._tenant("events", "--node", NODE_A, "--kind", "unreachable")
        self.assertEqual(0, done.returncode, done.stderr)
        (line,) = done.stdout.splitlines()
        self.assertIn(" unreachable ", line)
        self.assertNotIn("revoked", line)

    def test_tenant_cli_bad_option_is_one_line_and_exit_2(self) -> None:
        done = self._tenant("events", "--since", "last tuesday")
        self.assertEqual(2, done.returncode)
        self.assertEqual(1, len(done.stderr.splitlines()), done.stderr)
        self.assertIn("--since", done.stderr)
