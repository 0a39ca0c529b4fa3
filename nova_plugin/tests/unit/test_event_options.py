"""The event listing's options (``trusted-tenant events``, ``openstack
attestation event list``): relative times, one-line usage errors before
anything is sent, kinds printed as they are, and ``--all`` following the
``next`` links (issue 30 item 3)."""

from __future__ import annotations

import argparse
from typing import Any

import testtools

from nova_plugin.attestation import AttestationClient
from nova_plugin.commands.events import Events
from nova_plugin.event_filters import (
    add_event_options,
    event_query,
    event_row,
    next_params,
    relative_time,
)
from nova_plugin.exceptions import UsageError
from nova_plugin.tests.unit.test_tenant_cli import TenantCliCase, run_tenant
from verifier.protocol.messages.event_query import parse_time

NOW = parse_time("2026-11-27T21:00:00Z")
NODE = "0f1e2d3c-4b5a-4968-8776-655443322110"


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_event_options(parser)
    return parser.parse_args(list(argv))


class OptionsTest(testtools.TestCase):
    def test_relative_times_count_back_from_now(self) -> None:
        for text, ago in (("90s", 90), ("30m", 1800), ("1h", 3600), ("2d", 172800)):
            self.assertEqual(NOW - ago, relative_time(text, NOW, "--since"))

    def test_iso_times_are_taken_as_they_are(self) -> None:
        query = event_query(
            _args("--since", "2026-11-27T20:00:00Z", "--until", "1h"), NOW
        )
        self.assertEqual(
            {"since": "2026-11-27T20:00:00Z", "until": "2026-11-27T20:00:00Z"},
            {k: query.to_query()[k] for k in ("since", "until")},
        )

    def test_short_kind_becomes_the_type(self) -> None:
        query = event_query(_args("--kind", "unreachable", "--limit", "5"), NOW)
        self.assertEqual(("node.unreachable", 5), (query.kind, query.limit))

    def test_bad_options_name_the_option(self) -> None:
        for argv, option in (
            (("--since", "yesterday"), "--since"),
            (("--until", "2026-11-27T20:00:00"), "--until"),
            (("--kind", "exploded"), "--kind"),
            (("--limit", "1001"), "--limit"),
            (("--limit", "ten"), "--limit"),
            (("--node", "n1"), "--node"),
            (("--since", "1h", "--until", "2h"), "--since"),
        ):
            exc = self.assertRaises(UsageError, event_query, _args(*argv), NOW)
            self.assertTrue(str(exc).startswith(option), (argv, str(exc)))

    def test_unreachable_and_recovered_are_printed_as_such(self) -> None:
        lines = Events().lines(
            {
                "events": [
                    {"type": "node.unreachable", "created_at": "T2",
                     "node_uuid": NODE, "reason": "unreachable", "detail": "",
                     "delivered": True},
                    {"type": "node.recovered", "created_at": "T1",
                     "node_uuid": NODE, "reason": "recovered", "detail": "",
                     "delivered": False},
                ],
                "links": [],
            }
        )  # fmt: skip
        self.assertEqual(2, len(lines))
        self.assertIn(" unreachable ", lines[0])
        self.assertIn(" recovered ", lines[1])
        self.assertNotIn("revoked", "".join(lines))

    def test_row_falls_back_to_the_signed_event(self) -> None:
        event = {"type": "node.failed", "created_at": "T", "node_uuid": NODE,
                 "reason": "internal", "detail": "d", "id": "e"}  # fmt: skip
        row = event_row({"signed_event": {"event": event}, "delivered": True})
        self.assertEqual(
            ("failed", "internal", "e"), (row["kind"], row["reason"], row["id"])
        )

    def test_next_params_reads_the_next_link(self) -> None:
        links = [
            {"rel": "next", "href": "/v1/events?limit=2&marker=m1&kind=node.failed"}
        ]
        self.assertEqual(
            {"limit": "2", "marker": "m1", "kind": "node.failed"}, next_params(links)
        )
        self.assertIsNone(next_params([]))


class TenantEventsInputTest(TenantCliCase):
    def test_a_bad_option_is_one_line_and_exit_2(self) -> None:
        code, err = run_tenant([*self.settings, "events", "--since", "soon"])
        self.assertEqual(2, code)
        self.assertEqual(1, err.count("\n"), err)
        self.assertTrue(err.startswith("trusted-tenant: error: --since:"), err)

    def test_limit_over_the_maximum_is_one_line_and_exit_2(self) -> None:
        code, err = run_tenant([*self.settings, "events", "--limit", "5000"])
        self.assertEqual(
            (2, "trusted-tenant: error: --limit: must be from 1 to 1000\n"),
            (code, err),
        )


class _Pages(AttestationClient):
    """Answers ``GET /v1/events`` from a list of pages."""

    def __init__(self, pages: list[dict[str, Any]]) -> None:
        self.pages = pages
        self.paths: list[str] = []

    def call(self, method: str, path: str, body: Any = None) -> Any:
        self.paths.append(path)
        return self.pages[len(self.paths) - 1]


class FollowLinksTest(testtools.TestCase):
    PAGES = [
        {"events": [{"id": "3"}, {"id": "2"}],
         "links": [{"rel": "next", "href": "/v1/events?limit=2&marker=2"}]},
        {"events": [{"id": "1"}], "links": []},
    ]  # fmt: skip

    def test_all_follows_next_links(self) -> None:
        client = _Pages(self.PAGES)
        page = client.list_events({"limit": "2"}, all_pages=True)
        self.assertEqual(["3", "2", "1"], [e["id"] for e in page["events"]])
        self.assertEqual(
            ["/v1/events?limit=2", "/v1/events?limit=2&marker=2"], client.paths
        )

    def test_one_page_without_all(self) -> None:
        client = _Pages(self.PAGES)
        page = client.list_events({"limit": "2"})
        self.assertEqual((2, 1), (len(page["events"]), len(client.paths)))
        self.assertEqual("2", next_params(page["links"])["marker"])  # type: ignore[index]

    def test_events_keeps_every_event_oldest_first(self) -> None:
        client = _Pages(self.PAGES)
        self.assertEqual(["1", "2", "3"], [e["id"] for e in client.events()])
