"""The verifier's word on a compute host (``PUT /v1/hosts/{host}/trust``):
:mod:`verifier.protocol.messages.host_trust`. One test per bad input."""

from __future__ import annotations

import uuid as uuid_mod
from typing import Any

import testtools

from verifier.protocol.errors import FieldError, MalformedError
from verifier.protocol.hosttrust import HostTrust
from verifier.protocol.messages.host_trust import HostTrustRecord, HostTrustUpdate

PROVIDER = str(uuid_mod.uuid4())
DIGEST = "ab" * 32


def _body(**changes: Any) -> dict[str, Any]:
    body = {
        "trusted": True,
        "ca_sha256": DIGEST,
        "provider": PROVIDER,
        "as_of": "2026-11-28T20:00:00Z",
    }
    body.update(changes)
    return body


class HostTrustUpdateTest(testtools.TestCase):
    def bad(self, field: str, **changes: Any) -> None:
        with self.assertRaises(FieldError) as ctx:
            HostTrustUpdate.from_dict(_body(**changes))
        self.assertEqual(field, ctx.exception.field)

    def test_round_trip(self) -> None:
        update = HostTrustUpdate.from_dict(_body())
        self.assertEqual(_body(), update.to_dict())
        self.assertEqual(update, HostTrustUpdate.from_dict(update.to_dict()))
        self.assertEqual(
            HostTrust(True, DIGEST, PROVIDER, update.as_of), update.trust()
        )

    def test_an_offset_is_the_same_time_in_utc(self) -> None:
        update = HostTrustUpdate.from_dict(_body(as_of="2026-11-28T21:00:00+01:00"))
        self.assertEqual("2026-11-28T20:00:00Z", update.to_dict()["as_of"])

    def test_no_ca_digest_is_null(self) -> None:
        self.assertIsNone(HostTrustUpdate.from_dict(_body(ca_sha256=None)).ca_sha256)

    def test_trusted_that_is_no_boolean_is_refused(self) -> None:
        self.bad("trusted", trusted=1)
        self.bad("trusted", trusted=None)

    def test_ca_digest_not_64_lower_case_hex_is_refused(self) -> None:
        self.bad("ca_sha256", ca_sha256="AB" * 32)
        self.bad("ca_sha256", ca_sha256="ab" * 31)
        self.bad("ca_sha256", ca_sha256=42)

    def test_provider_that_is_no_uuid_is_refused(self) -> None:
        with self.assertRaises(MalformedError):
            HostTrustUpdate.from_dict(_body(provider="compute-a"))
        self.bad("provider", provider=None)

    def test_time_without_a_zone_is_refused(self) -> None:
        self.bad("as_of", as_of="2026-11-28T20:00:00")

    def test_time_out_of_range_once_in_utc_is_refused(self) -> None:
        self.bad("as_of", as_of="0001-01-01T00:00:00+14:00")
        self.bad("as_of", as_of="9999-12-31T23:59:59-14:00")
        self.bad("as_of", as_of="1969-12-31T23:59:59Z")

    def test_time_that_is_no_iso_string_is_refused(self) -> None:
        self.bad("as_of", as_of="yesterday")
        self.bad("as_of", as_of=1764360000)
        self.bad("as_of", as_of="2026-11-28T20:00:00Z" + " " * 40)

    def test_unknown_field_is_refused(self) -> None:
        self.bad("host", host="compute-a")

    def test_a_producer_is_held_to_the_same_rules(self) -> None:
        for as_of in (float("nan"), float("inf"), True, -1.0):
            with self.assertRaises(FieldError):
                HostTrustUpdate(True, None, PROVIDER, as_of)


class HostTrustRecordTest(testtools.TestCase):
    def test_round_trip_with_and_without_a_record(self) -> None:
        trust = HostTrust(False, None, PROVIDER, 1764360000.0)
        for record in (
            HostTrustRecord("compute-a", trust, applied=False),
            HostTrustRecord("compute-a", None),
        ):
            self.assertEqual(record, HostTrustRecord.from_dict(record.to_dict()))

    def test_bad_host_name_is_refused(self) -> None:
        with self.assertRaises(FieldError):
            HostTrustRecord("a b", None)
