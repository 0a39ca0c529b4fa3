"""The quote exchange's typed messages (verifier.protocol.messages.quote):
round trips, and every malformed field refused with MalformedError (a
request's with the agent's error code)."""

from __future__ import annotations

import base64
import os

import hypothesis
import testtools
from hypothesis import strategies as st

from trusted_testing.softtpm import SoftTpm
from verifier.protocol import MalformedError, Quote, bind_nonce
from verifier.protocol.messages.quote import (
    MAX_IMA_BYTES,
    MAX_MB_LOG_BYTES,
    ImaPart,
    QuoteAnswer,
    QuoteRequest,
    QuoteRequestError,
)

NK = bytes(range(32))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class QuoteRequestTest(testtools.TestCase):
    def test_round_trip_through_the_query(self) -> None:
        request = QuoteRequest(os.urandom(20), (0, 7, 10), True, 42, True)
        query = request.to_query()
        self.assertEqual({"nonce", "pcrs", "csr", "ima_from", "mb"}, set(query), query)
        self.assertEqual("0,7,10", query["pcrs"])
        self.assertEqual(request, QuoteRequest.from_query(query))

    def test_query_leaves_out_what_is_not_asked(self) -> None:
        query = QuoteRequest(b"n" * 8, (16,)).to_query()
        self.assertEqual({"nonce": "6e" * 8, "pcrs": "16", "csr": "0"}, query)

    def test_pcrs_are_sorted_and_deduplicated(self) -> None:
        query = {"nonce": "00" * 16, "pcrs": "17, 16,17"}
        self.assertEqual((16, 17), QuoteRequest.from_query(query).pcrs)

    def _code(self, query: dict[str, str]) -> str:
        exc = self.assertRaises(QuoteRequestError, QuoteRequest.from_query, query)
        self.assertIsInstance(exc, MalformedError)
        return exc.code

    def test_each_bad_parameter_has_its_code(self) -> None:
        ok = {"nonce": "00" * 16, "pcrs": "16"}
        for bad, code in (
            ({"nonce": "zz" * 8}, "bad_nonce"),
            ({"nonce": "00" * 7}, "bad_nonce"),
            ({"nonce": "00" * 33}, "bad_nonce"),
            ({"nonce": ""}, "bad_nonce"),
            ({"pcrs": ""}, "bad_pcrs"),
            ({"pcrs": "24"}, "bad_pcrs"),
            ({"pcrs": "-1"}, "bad_pcrs"),
            ({"pcrs": "16,,17"}, "bad_pcrs"),
            ({"pcrs": "١٦"}, "bad_pcrs"),  # digits, but not ASCII ones
            ({"pcrs": ",".join(["1"] * 25)}, "bad_pcrs"),
            ({"csr": "yes"}, "bad_csr"),
            ({"mb": "2"}, "bad_mb"),
            ({"ima_from": "-3"}, "bad_ima_from"),
            ({"ima_from": "1" * 13}, "bad_ima_from"),
        ):
            self.assertEqual(code, self._code(ok | bad), bad)
        self.assertEqual("bad_nonce", self._code({"pcrs": "16"}))

    def test_constructor_validates_too(self) -> None:
        for args, code in (
            ((b"short", (16,)), "bad_nonce"),
            ((b"n" * 8, ()), "bad_pcrs"),
            ((b"n" * 8, (24,)), "bad_pcrs"),
            ((b"n" * 8, (True,)), "bad_pcrs"),
            ((b"n" * 8, tuple(range(24)) + (0,)), "bad_pcrs"),
            ((b"n" * 8, (16,), 1), "bad_csr"),
            ((b"n" * 8, (16,), False, -1), "bad_ima_from"),
            ((b"n" * 8, (16,), False, None, "1"), "bad_mb"),
        ):
            exc = self.assertRaises(QuoteRequestError, QuoteRequest, *args)
            self.assertEqual(code, exc.code, args)

    @hypothesis.settings(max_examples=60, deadline=None)
    @hypothesis.given(
        st.binary(min_size=8, max_size=32),
        st.sets(st.integers(0, 23), min_size=1),
        st.booleans(),
        st.none() | st.integers(0, 10**11),
        st.booleans(),
    )
    def test_any_valid_request_round_trips(
        self, nonce: bytes, pcrs: set[int], csr: bool, ima: int | None, mb: bool
    ) -> None:
        request = QuoteRequest(nonce, tuple(sorted(pcrs)), csr, ima, mb)
        self.assertEqual(request, QuoteRequest.from_query(request.to_query()))


class QuoteAnswerTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.quote = SoftTpm().quote(bind_nonce(b"n" * 20, NK), (16,))

    def full(self) -> QuoteAnswer:
        ima = ImaPart(3, "10 " + "00" * 20 + " ima-ng sha256:00 /x\n", more=True)
        return QuoteAnswer(
            self.quote, NK, b"csr der", ima, None, b"\x00mb log", "not here"
        )

    def test_round_trip(self) -> None:
        for answer in (QuoteAnswer(self.quote, NK), self.full()):
            wire = answer.to_dict()
            self.assertEqual(answer, QuoteAnswer.from_dict(wire))
        self.assertEqual({"quote", "nk"}, set(QuoteAnswer(self.quote, NK).to_dict()))

    def test_binary_ima_part_round_trips_as_base64(self) -> None:
        part = ImaPart(0, b"\x0a\x00\x00\x00binary")
        wire = part.to_dict()
        self.assertEqual(
            ("binary", _b64(part.entries)), (wire["format"], wire["entries"])
        )  # type: ignore[arg-type]
        self.assertEqual(part, ImaPart.from_dict(wire))

    def _refused(self, change: dict[str, object], word: str) -> None:
        wire = QuoteAnswer(self.quote, NK).to_dict() | change
        exc = self.assertRaises(MalformedError, QuoteAnswer.from_dict, wire)
        self.assertIn(word, str(exc))

    def test_answer_that_is_not_an_object_is_malformed(self) -> None:
        for data in (None, [], "quote", 3):
            self.assertRaises(MalformedError, QuoteAnswer.from_dict, data)

    def test_bad_fields_are_malformed(self) -> None:
        self._refused({"nk": None}, "'nk' missing")
        self._refused({"nk": 12345}, "'nk'")
        self._refused({"nk": "not base64 !!!"}, "base64")
        self._refused({"quote": None}, "quote")
        self._refused({"csr": "%%%"}, "'csr'")
        self._refused({"csr": _b64(bytes(16385))}, "'csr'")
        self._refused({"ima": []}, "'ima'")
        self._refused({"ima_error": 5}, "'ima_error'")
        self._refused({"mb_error": {}}, "'mb_error'")
        self._refused({"mb_log": "@@"}, "mb_log")
        self._refused({"mb_log": "A" * (3 << 20)}, "exceeds")

    def test_nk_of_the_wrong_length_is_malformed(self) -> None:
        for size in (0, 5, 31, 33, 64):
            self._refused({"nk": _b64(bytes(size))}, "32-byte")
        self.assertRaises(MalformedError, QuoteAnswer, self.quote, bytes(31))

    def test_constructor_refuses_wrong_types(self) -> None:
        wire = self.quote.to_dict()
        self.assertRaises(MalformedError, QuoteAnswer, wire, NK)  # a dict
        self.assertRaises(MalformedError, QuoteAnswer, self.quote, NK, ima={})
        self.assertRaises(
            MalformedError,
            QuoteAnswer,
            self.quote,
            NK,
            mb_log=bytes(MAX_MB_LOG_BYTES + 1),
        )

    def test_bad_ima_parts_are_malformed(self) -> None:
        for data, word in (
            ({"from": -1, "format": "ascii", "entries": ""}, "non-negative"),
            ({"from": True, "format": "ascii", "entries": ""}, "non-negative"),
            ({"from": 0, "format": "xml", "entries": ""}, "format"),
            ({"from": 0, "format": "ascii", "entries": 5}, "string"),
            ({"from": 0, "format": "binary", "entries": "!!"}, "base64"),
            ({"from": 0, "format": "ascii", "entries": "", "more": 1}, "more"),
            (
                {"from": 0, "format": "ascii", "entries": "x" * (MAX_IMA_BYTES + 1)},
                "exceeds",
            ),
        ):
            exc = self.assertRaises(MalformedError, ImaPart.from_dict, data)
            self.assertIn(word, str(exc))

    def test_quote_field_is_the_protocol_quote(self) -> None:
        answer = QuoteAnswer.from_dict(self.full().to_dict())
        self.assertIsInstance(answer.quote, Quote)
        self.assertEqual(self.quote, answer.quote)
