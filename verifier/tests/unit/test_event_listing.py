"""Events you can query (issue 30 item 3): the query of ``GET /v1/events``
(:mod:`verifier.protocol.messages.event_query`), its pages in the outbox
(``Outbox.page``) and the API's answers (filters, links, JSON 400s)."""

from __future__ import annotations

import os
import tempfile
import unittest
import uuid as uuid_mod
from typing import Any
from urllib.parse import parse_qs, urlsplit

import sqlalchemy as sa
import testtools
from aiohttp.test_utils import TestClient, TestServer
from cryptography.hazmat.primitives.asymmetric import ed25519
from multidict import MultiDict
from sqlalchemy.orm import Session

from trusted_testing.auth import open_auth
from verifier.api.verifier_app import make_app
from verifier.db import OutboxEvent, make_engine, upgrade
from verifier.notify import outbox as outbox_mod
from verifier.notify.outbox import Outbox, add_to_outbox, make_event
from verifier.protocol.errors import FieldError
from verifier.protocol.events import (
    NODE_POLICY_CHANGED,
    NODE_RECOVERED,
    NODE_REVOKED,
    NODE_UNREACHABLE,
)
from verifier.protocol.messages.event_query import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    EventQuery,
    format_time,
    parse_time,
)
from verifier.tests.unit.test_attest_service import VerifierServiceBase

T0 = 1_790_000_000.0  # 2026-09-21T...Z
NODE_A = str(uuid_mod.uuid4())
NODE_B = str(uuid_mod.uuid4())


class EventQueryTest(testtools.TestCase):
    def _bad(self, query: dict[str, str], field: str) -> FieldError:
        exc = self.assertRaises(FieldError, EventQuery.from_query, query)
        self.assertEqual(field, exc.field)
        self.assertEqual("bad_field", exc.code)
        return exc

    def test_defaults(self) -> None:
        query = EventQuery.from_query({})
        self.assertEqual(EventQuery(), query)
        self.assertEqual(DEFAULT_LIMIT, query.limit)
        self.assertEqual({"limit": str(DEFAULT_LIMIT)}, query.to_query())

    def test_every_filter_parses_and_writes_back(self) -> None:
        raw = {
            "since": "2026-11-27T20:00:00Z",
            "until": "2026-11-27T21:00:00+01:00",
            "node": NODE_A.upper(),
            "kind": "unreachable",
            "reason": "unreachable_timeout",
            "limit": "7",
            "marker": NODE_B,
        }
        query = EventQuery.from_query(raw)
        self.assertEqual(parse_time("2026-11-27T20:00:00Z"), query.since)
        self.assertEqual(query.since, query.until)  # same instant, other zone
        self.assertEqual(NODE_A, query.node)
        self.assertEqual(NODE_UNREACHABLE, query.kind)
        self.assertEqual(7, query.limit)
        self.assertEqual(query, EventQuery.from_query(query.to_query()))
        self.assertEqual("2026-11-27T20:00:00Z", query.to_query()["until"])

    def test_full_and_short_kind_names_are_the_same(self) -> None:
        for short, full in (("revoked", NODE_REVOKED), ("recovered", NODE_RECOVERED)):
            self.assertEqual(
                EventQuery.from_query({"kind": full}),
                EventQuery.from_query({"kind": short}),
            )

    def test_time_without_zone_is_refused(self) -> None:
        exc = self._bad({"since": "2026-11-27T20:00:00"}, "since")
        self.assertIn("time zone", str(exc))

    def test_malformed_time_is_refused(self) -> None:
        self._bad({"until": "yesterday"}, "until")
        self._bad({"since": "1h"}, "since")  # relative: the CLI's, not the API's

    def test_unknown_kind_is_refused(self) -> None:
        self._bad({"kind": "node.exploded"}, "kind")

    def test_limit_out_of_range_is_refused(self) -> None:
        for limit in ("0", str(MAX_LIMIT + 1), "-1", "ten", "1e3", ""):
            self._bad({"limit": limit}, "limit")
        self.assertEqual(MAX_LIMIT, EventQuery.from_query({"limit": "1000"}).limit)

    def test_since_after_until_is_refused(self) -> None:
        self._bad(
            {"since": "2026-11-27T21:00:00Z", "until": "2026-11-27T20:00:00Z"},
            "since",
        )

    def test_marker_and_node_must_be_uuids(self) -> None:
        self._bad({"marker": "12"}, "marker")
        self._bad({"node": "not-a-node"}, "node")

    def test_bad_reason_is_refused(self) -> None:
        self._bad({"reason": "x" * 65}, "reason")
        self._bad({"reason": "a b"}, "reason")

    def test_unknown_or_repeated_parameter_is_refused(self) -> None:
        self._bad({"type": "revoked"}, "type")
        self._bad(MultiDict([("kind", "revoked"), ("kind", "failed")]), "kind")  # type: ignore[arg-type]

    def test_format_time_is_utc_iso(self) -> None:
        self.assertEqual("2026-11-27T20:00:00Z", format_time(1795809600.0))
        self.assertEqual(1795809600.5, parse_time(format_time(1795809600.5)))


class _Rows:
    """Stages events with chosen times straight in the outbox."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        self.key = ed25519.Ed25519PrivateKey.generate()

    def add(
        self,
        node: str,
        now: float,
        kind: str = NODE_REVOKED,
        reason: str = "pcr_policy",
        project: str = "alpha",
    ) -> str:
        signed = make_event(self.key, node, reason, f"detail {now}", now, kind)
        with Session(self.engine) as session, session.begin():
            add_to_outbox(session, signed, now, project)
        return signed.event.id


class OutboxPageTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.engine = make_engine("sqlite:///" + os.path.join(tmp.name, "o.db"))
        self.addCleanup(self.engine.dispose)
        upgrade(self.engine)
        self.outbox = Outbox(self.engine, [])
        self.rows = _Rows(self.engine)

    def _ids(self, query: EventQuery, project: str | None = "alpha") -> list[str]:
        return [e["id"] for e in self.outbox.page(query, project).events]

    def _all_pages(self, query: EventQuery, project: str | None) -> list[str]:
        seen: list[str] = []
        while True:
            page = self.outbox.page(query, project)
            self.assertLessEqual(len(page.events), query.limit)
            seen += [e["id"] for e in page.events]
            if page.next_marker is None:
                return seen
            query = query.after(page.next_marker)

    def test_newest_first_with_top_level_fields(self) -> None:
        old = self.rows.add(NODE_A, T0, reason="quote_timeout")
        new = self.rows.add(NODE_A, T0 + 60, NODE_UNREACHABLE, "unreachable")
        page = self.outbox.page(EventQuery(), "alpha")
        self.assertEqual([new, old], [e["id"] for e in page.events])
        self.assertIsNone(page.next_marker)
        first = page.events[0]
        self.assertEqual(NODE_UNREACHABLE, first["type"])
        self.assertEqual("unreachable", first["reason"])
        self.assertEqual(f"detail {T0 + 60}", first["detail"])
        self.assertEqual(NODE_A, first["node_uuid"])
        self.assertEqual(format_time(T0 + 60), first["created_at"])
        self.assertEqual(new, first["signed_event"]["event"]["id"])
        self.assertEqual(
            (False, 0, None),
            tuple(first[k] for k in ("delivered", "attempts", "last_error")),
        )

    def test_pages_with_equal_times_neither_skip_nor_repeat(self) -> None:
        made = [self.rows.add(NODE_A, T0 + (i // 4)) for i in range(13)]
        seen = self._all_pages(EventQuery(limit=3), "alpha")
        self.assertEqual(sorted(made), sorted(seen))
        self.assertEqual(len(made), len(set(seen)))

    def test_last_full_page_has_no_next_marker(self) -> None:
        for i in range(4):
            self.rows.add(NODE_A, T0 + i)
        first = self.outbox.page(EventQuery(limit=2), "alpha")
        self.assertIsNotNone(first.next_marker)
        assert first.next_marker is not None
        second = self.outbox.page(
            EventQuery(limit=2, marker=first.next_marker), "alpha"
        )
        self.assertEqual(2, len(second.events))
        self.assertIsNone(second.next_marker)

    def test_filters_by_node_time_kind_and_reason(self) -> None:
        a1 = self.rows.add(NODE_A, T0, NODE_UNREACHABLE, "unreachable")
        a2 = self.rows.add(NODE_A, T0 + 10, NODE_RECOVERED, "recovered")
        b1 = self.rows.add(NODE_B, T0 + 20, NODE_REVOKED, "ima_policy")
        b2 = self.rows.add(NODE_B, T0 + 30, NODE_POLICY_CHANGED, "set")
        self.assertEqual([a2, a1], self._ids(EventQuery(node=NODE_A)))
        self.assertEqual([b1, a2], self._ids(EventQuery(since=T0 + 10, until=T0 + 30)))
        self.assertEqual([a1], self._ids(EventQuery(kind="unreachable")))
        self.assertEqual([b1], self._ids(EventQuery(reason="ima_policy")))
        self.assertEqual(
            [b2], self._ids(EventQuery(node=NODE_B, kind="policy_changed"))
        )
        self.assertEqual([], self._ids(EventQuery(node=NODE_A, reason="ima_policy")))

    def test_project_sees_only_its_own(self) -> None:
        mine = self.rows.add(NODE_A, T0)
        theirs = self.rows.add(NODE_B, T0 + 1, project="beta")
        self.assertEqual([mine], self._ids(EventQuery()))
        self.assertEqual([theirs, mine], self._ids(EventQuery(), project=None))

    def test_marker_of_another_project_is_refused_like_a_missing_one(self) -> None:
        self.rows.add(NODE_A, T0)
        theirs = self.rows.add(NODE_B, T0 + 1, project="beta")
        for marker in (theirs, str(uuid_mod.uuid4())):
            exc = self.assertRaises(
                FieldError, self.outbox.page, EventQuery(marker=marker), "alpha"
            )
            self.assertEqual(
                ("marker", "malformed event query: 'marker' names no event"),
                (exc.field, str(exc)),
            )

    def test_kind_and_reason_filter_in_sql_past_other_rows(self) -> None:
        wanted = self.rows.add(NODE_A, T0, NODE_UNREACHABLE, "unreachable")
        others = [self.rows.add(NODE_A, T0 + 1 + i) for i in range(5)]
        first = self.outbox.page(EventQuery(kind="unreachable", limit=1), "alpha")
        # one query: the match, past the five newer others, and no next page
        self.assertEqual(
            ([wanted], None), ([e["id"] for e in first.events], first.next_marker)
        )
        page = self.outbox.page(EventQuery(reason="pcr_policy", limit=5), "alpha")
        self.assertEqual(others[::-1], [e["id"] for e in page.events])

    def test_long_reason_is_kept_in_the_body_only(self) -> None:
        long = "x" * (outbox_mod.REASON_MAX + 1)
        self.rows.add(NODE_A, T0, reason=long)
        with Session(self.engine) as session:
            row = session.scalars(sa.select(OutboxEvent)).one()
        self.assertEqual((None, "node.revoked"), (row.reason, row.type))
        self.assertIn(long, row.body)


class EventListApiTest(VerifierServiceBase):
    """``GET /v1/events`` over HTTP (open auth: every project)."""

    async def asyncSetUp(self) -> None:
        await super().asyncSetUp()
        self.verifier = self.new_verifier()
        app = make_app(self.verifier, "KEY", open_auth())
        self.client = TestClient(TestServer(app, host="127.0.0.1"))
        await self.client.start_server()
        self.addAsyncCleanup(self.client.close)
        self.rows = _Rows(self.engine)

    async def _get(self, path: str, status: int = 200) -> Any:
        resp = await self.client.get(path)
        body = await resp.json()
        self.assertEqual(status, resp.status, body)
        return body

    def _stored(self) -> list[tuple[Any, ...]]:
        with Session(self.engine) as session:
            return [tuple(r) for r in session.execute(sa.select(OutboxEvent.__table__))]

    async def test_links_lead_through_every_page(self) -> None:
        made = [self.rows.add(NODE_A, T0 + i // 2) for i in range(5)]
        path, seen, pages = "/v1/events?limit=2&node=" + NODE_A, [], 0
        while path:
            body = await self._get(path)
            pages += 1
            seen += [e["id"] for e in body["events"]]
            links = [link["href"] for link in body["links"] if link["rel"] == "next"]
            path = links[0] if links else ""
            if path:
                query = parse_qs(urlsplit(path).query)
                self.assertEqual(([NODE_A], ["2"]), (query["node"], query["limit"]))
        self.assertEqual((3, 5), (pages, len(seen)))
        self.assertEqual(sorted(made), sorted(seen))
        # newest first: the last made (alone at its time) comes first
        self.assertEqual(made[-1], seen[0])

    async def test_no_links_when_all_fit(self) -> None:
        self.rows.add(NODE_A, T0)
        body = await self._get("/v1/events")
        self.assertEqual(([], 1), (body["links"], len(body["events"])))

    async def test_bad_input_is_a_json_400_naming_the_parameter(self) -> None:
        self.rows.add(NODE_A, T0)
        before = self._stored()
        for query, name in (
            ("since=2026-11-27T20:00:00", "since"),
            ("until=soon", "until"),
            ("kind=exploded", "kind"),
            ("limit=1001", "limit"),
            ("limit=0", "limit"),
            (f"marker={uuid_mod.uuid4()}", "marker"),
            ("since=2026-11-27T21:00:00Z&until=2026-11-27T20:00:00Z", "since"),
            ("colour=red", "colour"),
        ):
            body = await self._get("/v1/events?" + query, 400)
            self.assertEqual("bad_field", body["error"]["code"], query)
            self.assertIn(f"'{name}'", body["error"]["message"], query)
        self.assertEqual(before, self._stored())


if __name__ == "__main__":
    unittest.main()


class TimeFormatTest(testtools.TestCase):
    def test_printed_time_read_back_as_since_never_falls_after_the_event(
        self,
    ) -> None:
        from verifier.protocol.messages.event_query import format_time, parse_time

        for i in range(20000):
            stored = 1764280869.0 + i * 0.3183098861  # microsecond fractions
            self.assertLessEqual(parse_time(format_time(stored)), stored)
