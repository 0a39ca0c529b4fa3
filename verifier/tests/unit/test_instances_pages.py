"""Following Nova's ``GET /servers`` pages: only to Nova's own endpoint."""

from __future__ import annotations

import testtools

from verifier.attest.instances import _next_link
from verifier.exceptions import RequestError

BASE = "https://nova.example.test:8774/v2.1"


class NextLinkTest(testtools.TestCase):
    def test_next_link_on_the_compute_endpoint_is_followed(self) -> None:
        href = f"{BASE}/servers?limit=2&marker=abc"
        links = [{"rel": "self", "href": BASE}, {"rel": "next", "href": href}]
        self.assertEqual(href, _next_link(links, BASE))

    def test_last_page_has_no_next_link(self) -> None:
        for links in (None, [], [{"rel": "self", "href": BASE}], "next"):
            self.assertIsNone(_next_link(links, BASE))

    def test_next_link_elsewhere_is_refused_and_the_token_not_sent(self) -> None:
        for href in (
            "https://attacker.example.test:8774/v2.1/servers?marker=x",
            "http://nova.example.test:8774/v2.1/servers?marker=x",
            "https://nova.example.test:8775/v2.1/servers?marker=x",
            "https://nova.example.test:8774/other/servers?marker=x",
            None,
            7,
        ):
            exc = self.assertRaises(
                RequestError, _next_link, [{"rel": "next", "href": href}], BASE
            )
            self.assertEqual((503, "compute_unavailable"), (exc.status, exc.code))
