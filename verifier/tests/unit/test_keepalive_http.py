"""The lean keep-alive HTTP client of the quote loop, against aiohttp."""

from __future__ import annotations

import asyncio
import os
import tempfile

import testtools
from aiohttp import web

from verifier.ca import CertificateAuthority
from verifier.common import tls as tlsutil
from verifier.common._http import HttpError, KeepAliveClient


class KeepAliveClientTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.dir = tempfile.mkdtemp()
        ca = CertificateAuthority.create(self.dir, "test CA")
        ca.issue_to_files(self.dir, "client", ["127.0.0.1"])
        self.server_key, self.server_cert = tlsutil.self_signed_certificate(
            "agent", ["127.0.0.1"]
        )
        self.ca_pem = ca.cert_pem.decode()
        self.client_ctx = tlsutil.pinned_client_context(
            os.path.join(self.dir, "client.pem"),
            os.path.join(self.dir, "client-key.pem"),
            self.server_cert.decode(),
        )
        self.peers: list[object] = []

    async def _server(self) -> tuple[web.AppRunner, int]:
        async def quote(request: web.Request) -> web.StreamResponse:
            self.peers.append(request.transport.get_extra_info("peername"))
            if request.query.get("mode") == "chunked":
                resp = web.StreamResponse()
                resp.enable_chunked_encoding()
                await resp.prepare(request)
                await resp.write(b'{"a": ')
                await resp.write(b"1}")
                await resp.write_eof()
                return resp
            if request.query.get("mode") == "slow":
                await asyncio.sleep(2)
            if request.query.get("mode") == "close":
                return web.json_response(
                    {"closed": True}, headers={"Connection": "close"}
                )
            return web.json_response(dict(request.query))

        async def post(request: web.Request) -> web.Response:
            return web.json_response(await request.json(), status=202)

        app = web.Application()
        app.router.add_get("/q", quote)
        app.router.add_post("/p", post)
        runner = web.AppRunner(app)
        await runner.setup()
        ctx = tlsutil.server_context_from_pem(
            self.server_cert, self.server_key, self.ca_pem, self.dir
        )
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
        await site.start()
        return runner, int(runner.addresses[0][1])

    def run_async(self, body):  # type: ignore[no-untyped-def]
        async def main():  # type: ignore[no-untyped-def]
            runner, port = await self._server()
            client = KeepAliveClient(timeout=1.0)
            try:
                return await body(client, port)
            finally:
                await client.close()
                await runner.cleanup()

        return asyncio.run(main())

    def test_requests_reuse_one_connection(self) -> None:
        async def body(client, port):  # type: ignore[no-untyped-def]
            out = []
            for i in range(5):
                out.append(
                    await client.request(
                        "GET", "127.0.0.1", port, self.client_ctx, "/q", {"i": str(i)}
                    )
                )
            return out

        answers = self.run_async(body)
        self.assertEqual([(200, f'{{"i": "{i}"}}'.encode()) for i in range(5)], answers)
        self.assertEqual(1, len(set(self.peers)))

    def test_post_body_and_status(self) -> None:
        async def body(client, port):  # type: ignore[no-untyped-def]
            return await client.request(
                "POST", "127.0.0.1", port, self.client_ctx, "/p", None, b'{"v": "x"}'
            )

        self.assertEqual((202, b'{"v": "x"}'), self.run_async(body))

    def test_chunked_answer(self) -> None:
        async def body(client, port):  # type: ignore[no-untyped-def]
            return await client.request(
                "GET", "127.0.0.1", port, self.client_ctx, "/q", {"mode": "chunked"}
            )

        self.assertEqual((200, b'{"a": 1}'), self.run_async(body))

    def test_server_closing_connection_reconnects(self) -> None:
        async def body(client, port):  # type: ignore[no-untyped-def]
            await client.request(
                "GET", "127.0.0.1", port, self.client_ctx, "/q", {"mode": "close"}
            )
            return await client.request(
                "GET", "127.0.0.1", port, self.client_ctx, "/q", {"i": "2"}
            )

        self.assertEqual((200, b'{"i": "2"}'), self.run_async(body))
        self.assertEqual(2, len(set(self.peers)))

    def test_timeout_raises_http_error(self) -> None:
        async def body(client, port):  # type: ignore[no-untyped-def]
            return await client.request(
                "GET", "127.0.0.1", port, self.client_ctx, "/q", {"mode": "slow"}
            )

        self.assertRaises(HttpError, self.run_async, body)

    def test_wrong_pinned_certificate_raises_http_error(self) -> None:
        _, other = tlsutil.self_signed_certificate("other", ["127.0.0.1"])
        ctx = tlsutil.pinned_client_context(
            os.path.join(self.dir, "client.pem"),
            os.path.join(self.dir, "client-key.pem"),
            other.decode(),
        )

        async def body(client, port):  # type: ignore[no-untyped-def]
            return await client.request("GET", "127.0.0.1", port, ctx, "/q")

        self.assertRaises(HttpError, self.run_async, body)

    def test_nothing_listening_raises_http_error(self) -> None:
        async def body(client, port):  # type: ignore[no-untyped-def]
            return await client.request("GET", "127.0.0.1", 1, self.client_ctx, "/q")

        self.assertRaises(HttpError, self.run_async, body)

    def _pinning(self):  # type: ignore[no-untyped-def]
        return tlsutil.pinning_client_context(
            os.path.join(self.dir, "client.pem"),
            os.path.join(self.dir, "client-key.pem"),
        )

    def test_pinned_certificate_by_der_is_accepted(self) -> None:
        ctx, pin = self._pinning(), tlsutil.pinned_der(self.server_cert.decode())

        async def body(client, port):  # type: ignore[no-untyped-def]
            return await client.request(
                "GET", "127.0.0.1", port, ctx, "/q", {"i": "1"}, None, pin
            )

        self.assertEqual((200, b'{"i": "1"}'), self.run_async(body))

    def test_other_certificate_than_the_pin_is_refused(self) -> None:
        _, other = tlsutil.self_signed_certificate("other", ["127.0.0.1"])
        ctx, pin = self._pinning(), tlsutil.pinned_der(other.decode())

        async def body(client, port):  # type: ignore[no-untyped-def]
            return await client.request(
                "GET", "127.0.0.1", port, ctx, "/q", None, None, pin
            )

        e = self.assertRaises(HttpError, self.run_async, body)
        self.assertIn("pinned", str(e))
        self.assertEqual([], self.peers)  # no request was sent
