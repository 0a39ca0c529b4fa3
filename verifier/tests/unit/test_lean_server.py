"""The lean HTTP/1.1 server of the push endpoint
(verifier.common.lean_server over verifier.common._http11_request), over
real loopback connections with bytes written by hand: the answers and
connection handling a client relies on, and one named test per attack on
the framing (request smuggling, oversized heads and bodies, slow and
non-reading clients). A refused request gets the JSON error body naming
the problem and the connection is closed."""

from __future__ import annotations

import asyncio
import json
import ssl
import tempfile
import unittest
from collections.abc import Mapping
from typing import Any

import uvloop

from trusted_testing.https_server import Pki
from trusted_testing.lean_serve import LeanTestServer
from verifier.common import conventions
from verifier.common._http11_request import BadRequestError, RequestParser
from verifier.common.errors import RequestError
from verifier.common.lean_server import LastAnswer, LeanApp, Request

HOST = b"Host: 127.0.0.1\r\n"


def _echo(request: Request, params: Mapping[str, str]) -> tuple[int, Any]:
    """Echoes what it was sent."""
    return 201, {
        "id": params["id"],
        "body": request.body.decode(),
        "query": request.query,
        "request_id": conventions.current_request_id(),
    }


def _last(request: Request, params: Mapping[str, str]) -> tuple[int, Any]:
    """The last answer on its connection."""
    return LastAnswer(200, {"bye": True})


def _refuse(request: Request, params: Mapping[str, str]) -> tuple[int, Any]:
    raise RequestError("nope", "refused on purpose", 409)


def _broken(request: Request, params: Mapping[str, str]) -> tuple[int, Any]:
    raise KeyError("secret-token-in-a-bug")


def _app(max_body: int = 1024) -> LeanApp:
    too_large = ("evidence_too_large", f"evidence exceeds {max_body} bytes")
    app = LeanApp("test", max_body, too_large)
    app.add("POST", "/v1/things/{id}", _echo)
    app.add("POST", "/v1/refuse", _refuse)
    app.add("POST", "/v1/last", _last)
    app.add("POST", "/v1/broken", _broken)
    return app


class _Answer:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def code(self) -> str:
        return str(self.json()["error"]["code"])


async def _read_answer(reader: asyncio.StreamReader) -> _Answer:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return _Answer(status, headers, body)


class _ServerCase(unittest.IsolatedAsyncioTestCase):
    limits: dict[str, float] = {}

    async def asyncSetUp(self) -> None:
        self.server = LeanTestServer(_app(), **self.limits)
        await self.server.start_server()
        self.addAsyncCleanup(self.server.close)

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.server.port)
        self.addCleanup(writer.close)
        return reader, writer

    async def _closed(self, reader: asyncio.StreamReader) -> bool:
        try:
            return await asyncio.wait_for(reader.read(), 5.0) == b""
        except ConnectionResetError:
            return True

    async def _exchange(self, raw: bytes, answers: int = 1) -> list[_Answer]:
        reader, writer = await self._connect()
        writer.write(raw)
        return [await _read_answer(reader) for _ in range(answers)]


class LeanServerTest(_ServerCase):
    # -- answers -----------------------------------------------------------------

    async def test_route_answers_json_with_its_path_parameter_and_a_request_id(
        self,
    ) -> None:
        raw = b"POST /v1/things/abc?x=1 HTTP/1.1\r\n" + HOST
        (answer,) = await self._exchange(raw + b"Content-Length: 2\r\n\r\nhi")
        self.assertEqual(201, answer.status)
        self.assertEqual("application/json", answer.headers["content-type"])
        body = answer.json()
        self.assertEqual(
            ("abc", "hi", "x=1"), (body["id"], body["body"], body["query"])
        )
        # the handler ran under the id the answer carries
        rid = answer.headers[conventions.REQUEST_ID_HEADER.lower()]
        self.assertEqual(rid, body["request_id"])
        self.assertTrue(rid.startswith("req-"))
        self.assertIn("date", answer.headers)

    async def test_refusal_is_the_json_error_body_with_its_status(self) -> None:
        (answer,) = await self._exchange(
            b"POST /v1/refuse HTTP/1.1\r\n" + HOST + b"\r\n"
        )
        self.assertEqual((409, "nope"), (answer.status, answer.code))

    async def test_unexpected_error_is_a_generic_500_naming_nothing(self) -> None:
        with self.assertLogs("verifier.common.lean_server", "ERROR"):
            (answer,) = await self._exchange(
                b"POST /v1/broken HTTP/1.1\r\n" + HOST + b"\r\n"
            )
        self.assertEqual((500, "internal"), (answer.status, answer.code))
        self.assertNotIn(b"secret", answer.body)

    async def test_unknown_path_is_404_and_wrong_method_405(self) -> None:
        answers = await self._exchange(
            b"GET /v1/nowhere HTTP/1.1\r\n" + HOST + b"\r\n"
            b"GET /v1/things/a HTTP/1.1\r\n" + HOST + b"\r\n",
            2,
        )
        self.assertEqual(
            [(404, "not_found"), (405, "method_not_allowed")],
            [(a.status, a.code) for a in answers],
        )

    async def test_healthcheck_answers_ok_and_head_has_no_body(self) -> None:
        reader, writer = await self._connect()
        writer.write(b"GET /healthcheck HTTP/1.1\r\n" + HOST + b"\r\n")
        answer = await _read_answer(reader)
        self.assertEqual((200, b"OK"), (answer.status, answer.body))
        writer.write(
            b"HEAD /healthcheck HTTP/1.1\r\n" + HOST + b"Connection: close\r\n\r\n"
        )
        head = await reader.readuntil(b"\r\n\r\n")
        self.assertIn(b"Content-Length: 2\r\n", head)
        self.assertEqual(b"", await asyncio.wait_for(reader.read(), 5.0))

    async def test_openapi_document_lists_the_routes(self) -> None:
        (answer,) = await self._exchange(
            b"GET /v1/openapi.json HTTP/1.1\r\n" + HOST + b"\r\n"
        )
        doc = answer.json()
        self.assertEqual("3.0.3", doc["openapi"])
        self.assertIn("/v1/things/{id}", doc["paths"])
        self.assertEqual(
            "Echoes what it was sent.",
            doc["paths"]["/v1/things/{id}"]["post"]["summary"],
        )

    # -- connections -------------------------------------------------------------

    async def test_pipelined_requests_are_answered_in_order_on_one_connection(
        self,
    ) -> None:
        raw = b"".join(
            b"POST /v1/things/%d HTTP/1.1\r\n" % i
            + HOST
            + b"Content-Length: 1\r\n\r\nx"
            for i in range(5)
        )
        answers = await self._exchange(raw, 5)
        self.assertEqual(["0", "1", "2", "3", "4"], [a.json()["id"] for a in answers])

    async def test_request_split_over_many_writes_is_one_request(self) -> None:
        reader, writer = await self._connect()
        raw = (
            b"POST /v1/things/z HTTP/1.1\r\n" + HOST + b"Content-Length: 5\r\n\r\nhello"
        )
        for i in range(len(raw)):
            writer.write(raw[i : i + 1])
            await writer.drain()
        answer = await _read_answer(reader)
        self.assertEqual("hello", answer.json()["body"])

    async def test_connection_close_and_http10_close_after_the_answer(self) -> None:
        for raw in (
            b"POST /v1/things/a HTTP/1.1\r\n" + HOST + b"Connection: close\r\n\r\n",
            b"POST /v1/things/a HTTP/1.0\r\n\r\n",
        ):
            reader, writer = await self._connect()
            writer.write(raw)
            answer = await _read_answer(reader)
            self.assertEqual("close", answer.headers["connection"])
            self.assertTrue(await self._closed(reader))

    async def test_a_last_answer_closes_the_connection_after_it(self) -> None:
        reader, writer = await self._connect()
        writer.write(b"POST /v1/things/a HTTP/1.1\r\n" + HOST + b"\r\n")
        self.assertNotIn("connection", (await _read_answer(reader)).headers)
        writer.write(b"POST /v1/last HTTP/1.1\r\n" + HOST + b"\r\n")
        answer = await _read_answer(reader)
        self.assertEqual((200, {"bye": True}), (answer.status, answer.json()))
        self.assertEqual("close", answer.headers["connection"])
        self.assertTrue(await self._closed(reader))

    async def test_expect_100_continue_is_answered_before_the_body(self) -> None:
        reader, writer = await self._connect()
        writer.write(
            b"POST /v1/things/a HTTP/1.1\r\n"
            + HOST
            + b"Expect: 100-continue\r\nContent-Length: 2\r\n\r\n"
        )
        self.assertEqual(
            b"HTTP/1.1 100 Continue\r\n\r\n",
            await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0),
        )
        writer.write(b"ok")
        self.assertEqual("ok", (await _read_answer(reader)).json()["body"])

    # -- attacks on the framing --------------------------------------------------

    async def _refused(self, raw: bytes) -> _Answer:
        reader, writer = await self._connect()
        with self.assertLogs("verifier.common.lean_server", "WARNING"):
            writer.write(raw)
            answer = await _read_answer(reader)
        self.assertEqual("close", answer.headers["connection"])
        self.assertTrue(await self._closed(reader), "the connection stays open")
        return answer

    async def test_smuggling_content_length_with_transfer_encoding_is_refused(
        self,
    ) -> None:
        answer = await self._refused(
            b"POST /v1/things/a HTTP/1.1\r\n"
            + HOST
            + b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"0\r\n\r\nPOST /v1/refuse HTTP/1.1\r\n\r\n"
        )
        self.assertEqual((411, "length_required"), (answer.status, answer.code))

    async def test_smuggling_two_content_lengths_is_refused(self) -> None:
        answer = await self._refused(
            b"POST /v1/things/a HTTP/1.1\r\n"
            + HOST
            + b"Content-Length: 2\r\nContent-Length: 30\r\n\r\nhi"
        )
        self.assertEqual((400, "bad_header"), (answer.status, answer.code))

    async def test_smuggling_space_before_the_colon_is_refused(self) -> None:
        answer = await self._refused(
            b"POST /v1/things/a HTTP/1.1\r\n" + HOST + b"Content-Length : 2\r\n\r\nhi"
        )
        self.assertEqual((400, "bad_header"), (answer.status, answer.code))

    async def test_smuggling_folded_header_is_refused(self) -> None:
        answer = await self._refused(
            b"POST /v1/things/a HTTP/1.1\r\n"
            + HOST
            + b"X-A: 1\r\n Content-Length: 2\r\n\r\nhi"
        )
        self.assertEqual((400, "bad_header"), (answer.status, answer.code))

    async def test_smuggling_bare_lf_line_end_is_refused(self) -> None:
        answer = await self._refused(
            b"POST /v1/things/a HTTP/1.1\r\n"
            + HOST
            + b"X-A: 1\nContent-Length: 2\r\n\r\nhi"
        )
        self.assertEqual((400, "bad_request"), (answer.status, answer.code))

    async def test_signed_or_hex_content_length_is_refused(self) -> None:
        for value in (b"-1", b"+2", b"0x2", b"2 2", b"\xb3"):
            answer = await self._refused(
                b"POST /v1/things/a HTTP/1.1\r\n"
                + HOST
                + b"Content-Length: "
                + value
                + b"\r\n\r\nhi"
            )
            self.assertEqual((400, "bad_header"), (answer.status, answer.code), value)

    async def test_nul_in_a_header_value_is_refused(self) -> None:
        answer = await self._refused(
            b"POST /v1/things/a HTTP/1.1\r\n" + HOST + b"X-Probe: \x00\r\n\r\n"
        )
        self.assertEqual((400, "bad_header"), (answer.status, answer.code))

    async def test_http11_without_host_and_other_versions_are_refused(self) -> None:
        answer = await self._refused(b"POST /v1/things/a HTTP/1.1\r\n\r\n")
        self.assertEqual((400, "bad_request"), (answer.status, answer.code))
        for line in (
            b"POST /v1/things/a HTTP/2.0",
            b"POST http://h/v1 HTTP/1.1",
            b"POST  /v1/things/a HTTP/1.1",
            b"post /v1/things/a HTTP/1.1",
        ):
            answer = await self._refused(line + b"\r\n" + HOST + b"\r\n")
            self.assertEqual(
                (400, "bad_request_line"), (answer.status, answer.code), line
            )

    async def test_oversized_body_is_refused_from_its_length_without_reading_it(
        self,
    ) -> None:
        answer = await self._refused(
            b"POST /v1/things/a HTTP/1.1\r\n" + HOST + b"Content-Length: 1025\r\n\r\n"
        )
        self.assertEqual((413, "evidence_too_large"), (answer.status, answer.code))
        self.assertIn("1024 bytes", answer.json()["error"]["message"])

    async def test_oversized_request_line_is_refused_before_it_ends(self) -> None:
        answer = await self._refused(b"POST /" + b"a" * 9000)
        self.assertEqual((400, "line_too_long"), (answer.status, answer.code))

    async def test_oversized_head_is_refused_before_it_ends(self) -> None:
        pads = b"".join(b"X-Pad%d: " % i + b"p" * 6000 + b"\r\n" for i in range(3))
        answer = await self._refused(b"POST /v1/things/a HTTP/1.1\r\n" + HOST + pads)
        self.assertEqual((431, "head_too_large"), (answer.status, answer.code))

    async def test_oversized_header_is_refused_as_a_long_line(self) -> None:
        answer = await self._refused(
            b"POST /v1/things/a HTTP/1.1\r\n" + HOST + b"X-Pad: " + b"p" * 8200
        )
        self.assertEqual((400, "line_too_long"), (answer.status, answer.code))

    async def test_refused_client_still_sending_gets_its_answer(self) -> None:
        # the answer is written at once; what follows is read and dropped
        # (a close with unread bytes would reset the connection)
        reader, writer = await self._connect()
        with self.assertLogs("verifier.common.lean_server", "WARNING"):
            writer.write(b"GET /" + b"a" * 9000)
            answer = await _read_answer(reader)
            writer.write(b"b" * 200_000)
            await writer.drain()
        self.assertEqual((400, "line_too_long"), (answer.status, answer.code))
        self.assertTrue(await self._closed(reader))

    async def test_too_many_header_fields_are_refused(self) -> None:
        fields = b"".join(b"X-F%d: v\r\n" % i for i in range(101))
        answer = await self._refused(
            b"POST /v1/things/a HTTP/1.1\r\n" + HOST + fields + b"\r\n"
        )
        self.assertEqual((431, "bad_header"), (answer.status, answer.code))

    async def test_an_answer_refuses_nothing_the_next_request_did(self) -> None:
        # a refused request on one connection leaves the server serving others
        await self._refused(b"GARBAGE\r\n\r\n")
        (answer,) = await self._exchange(
            b"POST /v1/things/b HTTP/1.1\r\n" + HOST + b"\r\n"
        )
        self.assertEqual(201, answer.status)


class LeanServerTimeoutTest(_ServerCase):
    """The connection limits, made short."""

    limits = {"keepalive": 0.3, "request_timeout": 0.5}

    async def test_slow_request_is_cut_off_by_its_timeout(self) -> None:
        # slowloris: a byte at a time, never finishing the head
        reader, writer = await self._connect()
        loop = asyncio.get_running_loop()
        start = loop.time()
        writer.write(b"POST /v1/things/a HTTP/1.1\r\n")
        while not reader.at_eof() and loop.time() - start < 10:
            writer.write(b"X")
            await asyncio.sleep(0.05)
            if reader.at_eof() or writer.is_closing():
                break
            try:
                data = await asyncio.wait_for(reader.read(1), 0.01)
            except TimeoutError:
                continue
            if data == b"":
                break
        self.assertLess(loop.time() - start, 10, "the slow request was waited for")

    async def test_idle_connection_is_closed_after_keepalive(self) -> None:
        reader, writer = await self._connect()
        writer.write(b"POST /v1/things/a HTTP/1.1\r\n" + HOST + b"\r\n")
        self.assertEqual(201, (await _read_answer(reader)).status)
        self.assertEqual(b"", await asyncio.wait_for(reader.read(), 5.0))

    async def test_connection_in_use_is_kept_past_keepalive(self) -> None:
        reader, writer = await self._connect()
        for i in range(4):  # 4 x 0.2 s > the 0.3 s keepalive
            writer.write(b"POST /v1/things/%d HTTP/1.1\r\n" % i + HOST + b"\r\n")
            self.assertEqual(str(i), (await _read_answer(reader)).json()["id"])
            await asyncio.sleep(0.2)


class RequestParserTest(unittest.TestCase):
    def test_head_that_never_ends_is_refused_once_too_long_to_be_one(
        self,
    ) -> None:
        # the parser holds bytes until asked for a request: it does not
        # hold more than a head's worth without one
        parser = RequestParser(1024)
        with self.assertRaises(BadRequestError):
            for _ in range(100):
                parser.feed(b"X" * 1024)

    def test_empty_lines_between_requests_are_skipped(self) -> None:
        parser = RequestParser(1024)
        parser.feed(b"\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n")
        request = parser.next_request()
        assert request is not None
        self.assertEqual(
            ("GET", "/", True), (request.method, request.path, request.keep_alive)
        )
        self.assertFalse(parser.pending)


class LeanServerTlsTest(_ServerCase):
    """Over TLS run by the server itself (one read buffer for every
    connection), as the verifier serves the push port."""

    loop_factory: Any = None

    def _setupAsyncioRunner(self) -> None:  # noqa: N802 (unittest's name)
        if self.loop_factory is None:
            super()._setupAsyncioRunner()  # type: ignore[misc]
        else:
            self._asyncioRunner = asyncio.Runner(  # type: ignore[attr-defined]
                debug=True, loop_factory=self.loop_factory
            )

    async def asyncSetUp(self) -> None:
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.pki = Pki(tmp.name)
        server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_tls.load_cert_chain(self.pki.server_cert, self.pki.server_key)
        self.server = LeanTestServer(_app(1 << 20), server_tls, **self.limits)
        await self.server.start_server()
        self.addAsyncCleanup(self.server.close)

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        client_tls = ssl.create_default_context(cafile=self.pki.ca_file)
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", self.server.port, ssl=client_tls
        )
        self.addCleanup(writer.close)
        return reader, writer

    async def test_requests_and_a_large_body_on_one_kept_connection(self) -> None:
        reader, writer = await self._connect()
        big = b"b" * 700_000  # several reads of the shared buffer
        for i, body in enumerate((b"x", big, b"y")):
            writer.write(
                b"POST /v1/things/%d HTTP/1.1\r\n" % i
                + HOST
                + b"Content-Length: %d\r\n\r\n" % len(body)
                + body
            )
            answer = await _read_answer(reader)
            self.assertEqual(
                (str(i), body.decode()), (answer.json()["id"], answer.json()["body"])
            )

    async def test_connections_interleaved_keep_their_own_bytes(self) -> None:
        # reads of both land in the one buffer; neither sees the other's
        (r1, w1), (r2, w2) = await self._connect(), await self._connect()
        head = (
            b"POST /v1/things/%s HTTP/1.1\r\n"
            + HOST
            + b"Content-Length: 300000\r\n\r\n"
        )
        w1.write(head % b"one" + b"1" * 150_000)
        w2.write(head % b"two" + b"2" * 150_000)
        await w1.drain()
        await w2.drain()
        w2.write(b"2" * 150_000)
        w1.write(b"1" * 150_000)
        a2, a1 = await _read_answer(r2), await _read_answer(r1)
        self.assertEqual(("one", "1" * 300_000), (a1.json()["id"], a1.json()["body"]))
        self.assertEqual(("two", "2" * 300_000), (a2.json()["id"], a2.json()["body"]))

    async def test_plain_http_on_the_tls_port_is_dropped_and_tls_still_served(
        self,
    ) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.server.port)
        self.addCleanup(writer.close)
        writer.write(b"POST /v1/things/a HTTP/1.1\r\n" + HOST + b"\r\n")
        self.assertTrue(await self._closed(reader))
        (answer,) = await self._exchange(
            b"POST /v1/things/b HTTP/1.1\r\n" + HOST + b"\r\n"
        )
        self.assertEqual(201, answer.status)

    async def test_refusal_over_tls_is_answered_then_closed(self) -> None:
        reader, writer = await self._connect()
        writer.write(b"POST /v1/things/a HTTP/1.1\r\n\r\n")  # no Host
        with self.assertLogs("verifier.common.lean_server", "WARNING"):
            answer = await _read_answer(reader)
        self.assertEqual((400, "bad_request"), (answer.status, answer.code))
        self.assertTrue(await self._closed(reader))


class LeanServerTlsOnUvloopTest(LeanServerTlsTest):
    """The same on uvloop, the verifier's loop (its transports are not
    asyncio's classes)."""

    loop_factory = staticmethod(uvloop.new_event_loop)
