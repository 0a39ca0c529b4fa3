"""The one HTTP client's framing (:mod:`verifier.common._http11`) fed
answers split anywhere, and what importing the client pulls in."""

from __future__ import annotations

import subprocess
import sys

import testtools

from verifier.common._http11 import MAX_HEAD, HttpFramingError, Response, ResponseParser


class ResponseParserTest(testtools.TestCase):
    """The framing alone, fed one byte at a time (answers split anywhere)."""

    def parse(self, raw: bytes, max_body: int = 1024) -> Response:
        parser = ResponseParser(max_body)
        for i in range(len(raw)):
            parser.feed(raw[i : i + 1])
        if not parser.done:
            parser.feed_eof()
        assert parser.result is not None
        return parser.result

    def test_content_length_answer_split_anywhere(self) -> None:
        r = self.parse(
            b"HTTP/1.1 201 Created\r\nContent-Length: 5\r\nX-A: 1\r\n\r\nhello"
        )
        self.assertEqual(
            (201, b"hello", "1", True), (r.status, r.body, r.headers["x-a"], r.reusable)
        )

    def test_chunked_answer_with_extension_and_trailer(self) -> None:
        raw = (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nX-Trailer: t\r\n\r\n"
        )
        self.assertEqual(b"abcde", self.parse(raw).body)

    def test_interim_answer_is_skipped(self) -> None:
        raw = (
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
        )
        self.assertEqual(200, self.parse(raw).status)

    def test_connection_close_answer_is_not_reusable(self) -> None:
        raw = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
        self.assertFalse(self.parse(raw).reusable)

    def test_bad_chunk_size_is_refused(self) -> None:
        raw = (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"0x3\r\nabc\r\n0\r\n\r\n"
        )
        self.assertRaises(HttpFramingError, self.parse, raw)

    def test_status_code_with_a_non_ascii_digit_is_refused(self) -> None:
        # found by the http_response fuzz target: latin-1 '\xb3' is a digit
        # to str.isdigit() and made int() raise ValueError
        raw = b"HTTP/1.1 20\xb3 t\r\n\r\n"
        self.assertRaises(HttpFramingError, self.parse, raw)

    def test_conflicting_content_lengths_are_refused(self) -> None:
        raw = b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab"
        self.assertRaises(HttpFramingError, self.parse, raw)

    def test_header_block_too_large_is_refused(self) -> None:
        raw = b"HTTP/1.1 200 OK\r\nX: " + b"a" * (MAX_HEAD + 10)
        self.assertRaises(HttpFramingError, ResponseParser(10).feed, raw)


class ImportTest(testtools.TestCase):
    def test_client_needs_no_service_dependency(self) -> None:
        code = (
            "import sys, verifier.common.http, verifier.common.agent_client\n"
            "heavy = {'sqlalchemy', 'oslo_messaging', 'libvirt', 'tpm2_pytss',"
            " 'aiohttp', 'requests'}\n"
            "print(sorted(heavy & {m.split('.')[0] for m in sys.modules}))\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        )
        self.assertEqual("[]", out.stdout.strip())
