"""Requests aiohttp's parser refuses get the JSON error body, no echo and
no traceback (:mod:`verifier.common.web_runner`).

A server built by :class:`~verifier.common.web_runner.AppRunner`, as every
service's is, over a real loopback socket, with its log captured: a 60 kB
URL and a 20 kB header (carrying what could be a token) each get a JSON
400 naming the problem, and the log gets one WARNING line that quotes
neither.
"""

from __future__ import annotations

import asyncio
import json
import logging
import unittest

from aiohttp import web

from verifier.common import web_runner

_SECRET = b"gAAAAAB-a-token-that-must-not-be-logged-"


async def _ok(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


class ParserRefusalTest(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self) -> None:
        app = web.Application()
        app.router.add_get("/v1/nodes", _ok)
        self.runner = web_runner.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.port = self.runner.addresses[0][1]

    async def asyncTearDown(self) -> None:
        await self.runner.cleanup()

    async def _send(self, raw: bytes) -> tuple[int, dict[str, str], bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        try:
            writer.write(raw)
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(), 10)
        finally:
            writer.close()
        head, _, body = answer.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = dict(line.split(": ", 1) for line in lines[1:])
        return int(lines[0].split()[1]), headers, body

    async def _assert_json_400(self, raw: bytes, code: str, echoed: bytes) -> None:
        logs = self.assertLogs(level=logging.INFO)
        with logs as captured:
            status, headers, body = await self._send(raw)
        self.assertEqual(400, status, body)
        self.assertTrue(headers["Content-Type"].startswith("application/json"))
        error = json.loads(body)["error"]
        self.assertEqual(code, error["code"])
        self.assertIn("8190 bytes", error["message"])
        self.assertNotIn(echoed, body)
        self.assertEqual(1, len(captured.records), captured.output)
        (record,) = captured.records
        self.assertEqual(logging.WARNING, record.levelno)
        self.assertIsNone(record.exc_info)  # no traceback
        self.assertNotIn(echoed.decode(), record.getMessage())

    async def test_60kb_url_gets_json_400_without_echo_or_traceback(self) -> None:
        path = b"/v1/nodes?x=" + _SECRET + b"a" * 60_000
        raw = b"GET " + path + b" HTTP/1.1\r\nHost: h\r\n\r\n"
        await self._assert_json_400(raw, "line_too_long", _SECRET)

    async def test_20kb_header_gets_json_400_without_echo_or_traceback(self) -> None:
        value = _SECRET + b"b" * 20_000
        raw = (
            b"GET /v1/nodes HTTP/1.1\r\nHost: h\r\nX-Auth-Token: " + value + b"\r\n\r\n"
        )
        await self._assert_json_400(raw, "line_too_long", _SECRET)

    async def test_malformed_header_gets_json_400(self) -> None:
        raw = b"GET /v1/nodes HTTP/1.1\r\nHost: h\r\nno colon " + _SECRET + b"\r\n\r\n"
        status, _, body = await self._send(raw)
        self.assertEqual(400, status, body)
        self.assertEqual("bad_request", json.loads(body)["error"]["code"])
        self.assertNotIn(_SECRET, body)

    async def test_a_request_within_the_limits_is_served(self) -> None:
        path = b"/v1/nodes?x=" + b"a" * 8000
        raw = b"GET " + path + b" HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"
        status, _, body = await self._send(raw)
        self.assertEqual((200, {"ok": True}), (status, json.loads(body)))
