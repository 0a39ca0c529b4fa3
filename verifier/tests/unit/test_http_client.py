"""The one HTTP client (:mod:`verifier.common.http`) against real loopback
servers: an aiohttp application over mutual TLS, and a raw asyncio server
for answers no HTTP server library would send. Both run in a thread of
their own, so the blocking client can be tested against them too."""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import tempfile
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import testtools
import uvloop
from aiohttp import web

from verifier.ca import CertificateAuthority
from verifier.common import tls as tlsutil
from verifier.common.errors import TransportError
from verifier.common.http import Answer, AsyncClient, BlockingClient

T = TypeVar("T")
_BIG = 2 * 1024 * 1024


class _Loop:
    """An event loop in a daemon thread (the servers' side)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


def _app(peers: list[object]) -> web.Application:
    async def echo_query(request: web.Request) -> web.StreamResponse:
        peers.append(request.transport.get_extra_info("peername"))  # type: ignore[union-attr]
        mode = request.query.get("mode")
        if mode == "chunked":
            resp = web.StreamResponse()
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            await resp.write(b'{"a": ')
            await resp.write(b"1}")
            await resp.write_eof()
            return resp
        if mode == "slow":
            await asyncio.sleep(3)
        if mode == "close":
            return web.json_response({"closed": True}, headers={"Connection": "close"})
        if mode == "big":
            return web.Response(body=b"x" * _BIG, content_type="application/json")
        if mode == "text":
            return web.Response(text="<html>a proxy page</html>")
        if mode == "refuse":
            body = {"error": {"code": "unknown_node", "message": "no such node"}}
            return web.json_response(body, status=404)
        if mode == "oops":
            return web.Response(status=503, text="upstream down")
        return web.json_response(dict(request.query))

    async def echo_body(request: web.Request) -> web.Response:
        return web.json_response(await request.json(), status=201)

    async def no_content(request: web.Request) -> web.Response:
        return web.Response(status=204)

    app = web.Application()
    app.router.add_get("/q", echo_query)
    app.router.add_post("/p", echo_body)
    app.router.add_delete("/d", no_content)
    return app


async def _raw(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answers no HTTP library sends, chosen by the request path."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            path = head.split(b" ", 2)[1]
            if path == b"/ssh":
                writer.write(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")
            elif path == b"/truncated":
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{}")
                await writer.drain()
                break
            elif path == b"/smuggle":
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
                )
            elif path == b"/huge-chunks":
                writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                for _ in range(40):
                    writer.write(b"10000\r\n" + b" " * 0x10000 + b"\r\n")
            elif path == b"/until-close":
                writer.write(b'HTTP/1.0 200 OK\r\n\r\n{"old": true}')
                await writer.drain()
                break
            elif path == b"/once":  # answer, then drop the next request unanswered
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
                await writer.drain()
                await reader.readuntil(b"\r\n\r\n")
                break
            else:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def _hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Closes every connection at once (before any TLS handshake)."""
    writer.close()


class _Fixture:
    """The PKI, the servers and the client contexts, shared by a class."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp()
        ca = CertificateAuthority.create(self.dir, "test CA")
        ca.issue_to_files(self.dir, "server", ["127.0.0.1"])
        ca.issue_to_files(self.dir, "client", [])
        self.client = (self._f("client.pem"), self._f("client-key.pem"))
        self.ca_file = self._f("ca.pem")
        self.peers: list[object] = []
        self.loop = _Loop()
        self.runner = web.AppRunner(_app(self.peers))
        self.loop.run(self.runner.setup())
        server_ctx = tlsutil.server_context(
            self._f("server.pem"), self._f("server-key.pem"), self.ca_file
        )
        self.tls_port = self._site(server_ctx)
        self.plain_port = self._site(None)
        self.raw = self.loop.run(self._start_raw())
        self.raw_port = self.raw.sockets[0].getsockname()[1]
        self.raw_tls = self.loop.run(self._start_raw(server_ctx))
        self.raw_tls_port = self.raw_tls.sockets[0].getsockname()[1]
        self.hangup = self.loop.run(asyncio.start_server(_hang_up, "127.0.0.1", 0))
        self.hangup_port = self.hangup.sockets[0].getsockname()[1]
        with open(self._f("server.pem")) as f:
            self.server_pin = tlsutil.pinned_der(f.read())

    def _f(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def _site(self, ctx: ssl.SSLContext | None) -> int:
        site = web.TCPSite(self.runner, "127.0.0.1", 0, ssl_context=ctx)
        self.loop.run(site.start())
        return int(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]

    async def _start_raw(self, ctx: ssl.SSLContext | None = None) -> asyncio.Server:
        return await asyncio.start_server(_raw, "127.0.0.1", 0, ssl=ctx)

    def ca_context(self) -> ssl.SSLContext:
        return tlsutil.client_context(*self.client, self.ca_file)

    def pinning_context(self) -> ssl.SSLContext:
        return tlsutil.pinning_client_context(*self.client)

    @property
    def tls_url(self) -> str:
        return f"https://127.0.0.1:{self.tls_port}"

    @property
    def plain_url(self) -> str:
        return f"http://127.0.0.1:{self.plain_port}"

    @property
    def raw_url(self) -> str:
        return f"http://127.0.0.1:{self.raw_port}"

    @property
    def raw_tls_url(self) -> str:
        return f"https://127.0.0.1:{self.raw_tls_port}"

    def stop(self) -> None:
        self.raw.close()
        self.raw_tls.close()
        self.hangup.close()
        self.loop.run(self.runner.cleanup())
        self.loop.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Base(testtools.TestCase):
    fx: _Fixture
    use_uvloop = False

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.fx = _Fixture()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.fx.stop()
        super().tearDownClass()

    def run_client(
        self,
        body: Callable[[AsyncClient], Awaitable[T]],
        ctx: ssl.SSLContext | None = None,
        **kw: Any,
    ) -> T:
        async def main() -> T:
            async with AsyncClient(ctx or self.fx.ca_context(), **kw) as client:
                return await body(client)

        if self.use_uvloop:
            return uvloop.run(main())
        return asyncio.run(main())


class AsyncClientTest(_Base):
    def test_kept_alive_connection_is_reused(self) -> None:
        del self.fx.peers[:]

        async def body(client: AsyncClient) -> list[Any]:
            return [
                (
                    await client.request("GET", self.fx.tls_url + "/q", params={"i": i})
                ).data
                for i in "01234"
            ]

        self.assertEqual([{"i": i} for i in "01234"], self.run_client(body))
        self.assertEqual(5, len(self.fx.peers))
        self.assertEqual(1, len(set(self.fx.peers)))

    def test_refused_connection_is_a_transport_error(self) -> None:
        url = f"https://127.0.0.1:{_free_port()}/q"
        e = self.assertRaises(
            TransportError, self.run_client, lambda c: c.request("GET", url)
        )
        self.assertIn("connection refused", str(e))

    def test_server_certificate_from_another_ca_is_a_transport_error(self) -> None:
        other = tempfile.mkdtemp()
        CertificateAuthority.create(other, "another CA")
        ctx = tlsutil.client_context(*self.fx.client, os.path.join(other, "ca.pem"))
        del self.fx.peers[:]
        e = self.assertRaises(
            TransportError,
            self.run_client,
            lambda c: c.request("GET", self.fx.tls_url + "/q"),
            ctx,
        )
        self.assertIn("TLS certificate not accepted", str(e))
        self.assertEqual([], self.fx.peers)

    def test_pinned_certificate_is_accepted(self) -> None:
        async def body(client: AsyncClient) -> Answer:
            return await client.request(
                "GET", self.fx.tls_url + "/q?i=1", pin=self.fx.server_pin
            )

        answer = self.run_client(body, self.fx.pinning_context())
        self.assertEqual((200, {"i": "1"}), (answer.status, answer.data))

    def test_certificate_other_than_the_pin_is_a_transport_error(self) -> None:
        _, other = tlsutil.self_signed_certificate("other", ["127.0.0.1"])
        pin = tlsutil.pinned_der(other.decode())
        del self.fx.peers[:]

        async def body(client: AsyncClient) -> Answer:
            return await client.request("GET", self.fx.tls_url + "/q", pin=pin)

        e = self.assertRaises(
            TransportError, self.run_client, body, self.fx.pinning_context()
        )
        self.assertIn("not the pinned one", str(e))
        self.assertEqual([], self.fx.peers)  # no request was sent

    def test_pin_over_plain_http_is_a_transport_error(self) -> None:
        async def body(client: AsyncClient) -> Answer:
            return await client.request("GET", self.fx.plain_url + "/q", pin=b"x")

        self.assertRaises(TransportError, self.run_client, body)

    def test_timeout_is_a_transport_error(self) -> None:
        e = self.assertRaises(
            TransportError,
            self.run_client,
            lambda c: c.request("GET", self.fx.tls_url + "/q?mode=slow"),
            timeout=0.3,
        )
        self.assertIn("timed out", str(e))

    def test_oversize_answer_is_a_transport_error(self) -> None:
        e = self.assertRaises(
            TransportError,
            self.run_client,
            lambda c: c.request("GET", self.fx.tls_url + "/q?mode=big"),
            max_answer=_BIG - 1,
        )
        self.assertIn("larger than", str(e))

    def test_oversize_chunked_answer_is_a_transport_error(self) -> None:
        e = self.assertRaises(
            TransportError,
            self.run_client,
            lambda c: c.request("GET", self.fx.raw_url + "/huge-chunks"),
            max_answer=_BIG,
        )
        self.assertIn("larger than", str(e))

    def test_non_json_answer_is_a_transport_error(self) -> None:
        e = self.assertRaises(
            TransportError,
            self.run_client,
            lambda c: c.request("GET", self.fx.tls_url + "/q?mode=text"),
        )
        self.assertIn("not JSON", str(e))

    def test_non_json_answer_is_returned_when_json_is_not_expected(self) -> None:
        answer = self.run_client(
            lambda c: c.request(
                "GET", self.fx.tls_url + "/q?mode=text", expect_json=False
            )
        )
        self.assertEqual("<html>a proxy page</html>", answer.text())

    def test_chunked_answer_is_read(self) -> None:
        answer = self.run_client(
            lambda c: c.request("GET", self.fx.tls_url + "/q?mode=chunked")
        )
        self.assertEqual({"a": 1}, answer.data)

    def test_4xx_answer_is_returned_with_its_error_body(self) -> None:
        answer = self.run_client(
            lambda c: c.request("GET", self.fx.tls_url + "/q?mode=refuse")
        )
        self.assertEqual(404, answer.status)
        self.assertFalse(answer.ok)
        self.assertEqual("unknown_node", answer.error.code)
        self.assertEqual("no such node", answer.error.message)

    def test_5xx_answer_without_json_is_returned(self) -> None:
        answer = self.run_client(
            lambda c: c.request("GET", self.fx.tls_url + "/q?mode=oops")
        )
        self.assertEqual(
            (503, None, "upstream down"),
            (answer.status, answer.error.code, answer.error.message),
        )

    def test_post_json_body(self) -> None:
        answer = self.run_client(
            lambda c: c.request("POST", self.fx.tls_url + "/p", json={"v": "x"})
        )
        self.assertEqual((201, {"v": "x"}), (answer.status, answer.data))

    def test_no_content_answer(self) -> None:
        answer = self.run_client(lambda c: c.request("DELETE", self.fx.tls_url + "/d"))
        self.assertEqual((204, None), (answer.status, answer.data))

    def test_server_closing_the_connection_means_a_new_one(self) -> None:
        del self.fx.peers[:]

        async def body(client: AsyncClient) -> Answer:
            await client.request("GET", self.fx.tls_url + "/q?mode=close")
            return await client.request("GET", self.fx.tls_url + "/q?i=2")

        self.assertEqual({"i": "2"}, self.run_client(body).data)
        self.assertEqual(2, len(set(self.fx.peers)))

    def test_kept_alive_connection_dropped_unanswered_is_retried_once(self) -> None:
        async def body(client: AsyncClient) -> Answer:
            await client.request("GET", self.fx.raw_url + "/once")
            return await client.request("GET", self.fx.raw_url + "/any")

        self.assertEqual({}, self.run_client(body).data)

    def test_post_on_a_dropped_connection_is_not_sent_again(self) -> None:
        async def body(client: AsyncClient) -> Answer:
            await client.request("GET", self.fx.raw_url + "/once")
            return await client.request("POST", self.fx.raw_url + "/any", json={})

        self.assertRaises(TransportError, self.run_client, body)

    def test_non_http_answer_is_a_transport_error(self) -> None:
        e = self.assertRaises(
            TransportError,
            self.run_client,
            lambda c: c.request("GET", self.fx.raw_url + "/ssh"),
        )
        self.assertIn("not an HTTP/1.x answer", str(e))

    def test_truncated_answer_is_a_transport_error(self) -> None:
        e = self.assertRaises(
            TransportError,
            self.run_client,
            lambda c: c.request("GET", self.fx.raw_url + "/truncated"),
        )
        self.assertIn("before a complete answer", str(e))

    def test_content_length_with_chunked_is_a_transport_error(self) -> None:
        self.assertRaises(
            TransportError,
            self.run_client,
            lambda c: c.request("GET", self.fx.raw_url + "/smuggle"),
        )

    def test_answer_read_until_close(self) -> None:
        answer = self.run_client(
            lambda c: c.request("GET", self.fx.raw_url + "/until-close")
        )
        self.assertEqual({"old": True}, answer.data)

    def test_not_an_http_url_is_a_transport_error(self) -> None:
        self.assertRaises(
            TransportError,
            self.run_client,
            lambda c: c.request("GET", "ftp://127.0.0.1/x"),
        )

    def test_header_injection_is_a_transport_error(self) -> None:
        self.assertRaises(
            TransportError,
            self.run_client,
            lambda c: c.request(
                "GET", self.fx.plain_url + "/q", headers={"X": "a\r\nHost: evil"}
            ),
        )

    # TLS is run by the client itself (verifier.common._http_tls): its
    # failure paths, and the one read buffer shared by all connections

    def test_peer_closing_during_the_tls_handshake_is_a_transport_error(
        self,
    ) -> None:
        url = f"https://127.0.0.1:{self.fx.hangup_port}/q"
        self.assertRaises(
            TransportError, self.run_client, lambda c: c.request("GET", url)
        )

    def test_peer_not_speaking_tls_is_a_transport_error(self) -> None:
        url = f"https://127.0.0.1:{self.fx.plain_port}/q"
        self.assertRaises(
            TransportError, self.run_client, lambda c: c.request("GET", url)
        )

    def test_pinned_peer_closing_mid_answer_is_a_transport_error(self) -> None:
        e = self.assertRaises(
            TransportError,
            self.run_client,
            lambda c: c.request("GET", self.fx.raw_tls_url + "/truncated"),
        )
        self.assertIn("GET https://127.0.0.1", str(e))

    def test_tls_connection_dropped_unanswered_is_retried_once(self) -> None:
        async def body(client: AsyncClient) -> Answer:
            await client.request("GET", self.fx.raw_tls_url + "/once")
            return await client.request("GET", self.fx.raw_tls_url + "/any")

        self.assertEqual({}, self.run_client(body).data)

    def test_post_on_a_dropped_tls_connection_is_not_sent_again(self) -> None:
        async def body(client: AsyncClient) -> Answer:
            await client.request("GET", self.fx.raw_tls_url + "/once")
            return await client.request("POST", self.fx.raw_tls_url + "/any", json={})

        self.assertRaises(TransportError, self.run_client, body)

    def test_concurrent_tls_answers_do_not_mix(self) -> None:
        # every connection reads through the pool's one buffer
        async def body(client: AsyncClient) -> list[Any]:
            answers = await asyncio.gather(
                *(
                    client.request(
                        "GET",
                        self.fx.tls_url + "/q",
                        params={"i": str(i), "mode": "big" if i % 7 == 0 else ""},
                        expect_json=i % 7 != 0,
                    )
                    for i in range(40)
                )
            )
            return [a.data if i % 7 else len(a.body) for i, a in enumerate(answers)]

        expected = [
            _BIG if i % 7 == 0 else {"i": str(i), "mode": ""} for i in range(40)
        ]
        self.assertEqual(expected, self.run_client(body, max_idle=40))

    def test_large_answer_over_tls_is_read_whole(self) -> None:
        answer = self.run_client(
            lambda c: c.request(
                "GET", self.fx.tls_url + "/q?mode=big", expect_json=False
            )
        )
        self.assertEqual(b"x" * _BIG, answer.body)


class AsyncClientOnUvloopTest(AsyncClientTest):
    """The same, on uvloop (the verifier's loop): its transports are not
    asyncio's classes."""

    use_uvloop = True


class BlockingClientTest(_Base):
    def client(self, ctx: ssl.SSLContext | None = None, **kw: Any) -> BlockingClient:
        return BlockingClient(ctx or self.fx.ca_context(), **kw)

    def test_json_answer(self) -> None:
        answer = self.client().request("GET", self.fx.tls_url + "/q", params={"a": "b"})
        self.assertEqual((200, {"a": "b"}), (answer.status, answer.data))

    def test_refused_connection_is_a_transport_error(self) -> None:
        url = f"https://127.0.0.1:{_free_port()}/q"
        e = self.assertRaises(TransportError, self.client().request, "GET", url)
        self.assertIn("connection refused", str(e))

    def test_server_certificate_from_another_ca_is_a_transport_error(self) -> None:
        other = tempfile.mkdtemp()
        CertificateAuthority.create(other, "another CA")
        ctx = tlsutil.client_context(*self.fx.client, os.path.join(other, "ca.pem"))
        e = self.assertRaises(
            TransportError, self.client(ctx).request, "GET", self.fx.tls_url + "/q"
        )
        self.assertIn("TLS certificate not accepted", str(e))

    def test_certificate_other_than_the_pin_is_a_transport_error(self) -> None:
        _, other = tlsutil.self_signed_certificate("other", ["127.0.0.1"])
        client = self.client(self.fx.pinning_context())
        e = self.assertRaises(
            TransportError,
            client.request,
            "GET",
            self.fx.tls_url + "/q",
            pin=tlsutil.pinned_der(other.decode()),
        )
        self.assertIn("not the pinned one", str(e))
        ok = client.request("GET", self.fx.tls_url + "/q", pin=self.fx.server_pin)
        self.assertEqual(200, ok.status)

    def test_timeout_is_a_transport_error(self) -> None:
        e = self.assertRaises(
            TransportError,
            self.client(timeout=0.3).request,
            "GET",
            self.fx.tls_url + "/q?mode=slow",
        )
        self.assertIn("timed out", str(e))

    def test_oversize_answer_is_a_transport_error(self) -> None:
        self.assertRaises(
            TransportError,
            self.client(max_answer=_BIG - 1).request,
            "GET",
            self.fx.tls_url + "/q?mode=big",
        )

    def test_non_json_answer_is_a_transport_error(self) -> None:
        self.assertRaises(
            TransportError,
            self.client().request,
            "GET",
            self.fx.tls_url + "/q?mode=text",
        )

    def test_chunked_answer_is_read(self) -> None:
        answer = self.client().request("GET", self.fx.tls_url + "/q?mode=chunked")
        self.assertEqual({"a": 1}, answer.data)

    def test_4xx_answer_is_returned_with_its_error_body(self) -> None:
        answer = self.client().request("GET", self.fx.tls_url + "/q?mode=refuse")
        self.assertEqual((404, "unknown_node"), (answer.status, answer.error.code))

    def test_non_http_answer_is_a_transport_error(self) -> None:
        self.assertRaises(
            TransportError, self.client().request, "GET", self.fx.raw_url + "/ssh"
        )

    def test_plain_http_post(self) -> None:
        answer = self.client().request("POST", self.fx.plain_url + "/p", json=[1])
        self.assertEqual((201, [1]), (answer.status, answer.data))

    def test_raw_content_body(self) -> None:
        answer = self.client().request(
            "POST",
            self.fx.tls_url + "/p",
            content=b'{"raw": 1}',
            headers={"Content-Type": "application/json"},
        )
        self.assertEqual((201, {"raw": 1}), (answer.status, answer.data))

    def test_works_inside_a_running_event_loop(self) -> None:
        async def main() -> Answer:
            return self.client().request("GET", self.fx.tls_url + "/q?x=1")

        self.assertEqual({"x": "1"}, asyncio.run(main()).data)


class ServerContextTest(testtools.TestCase):
    def test_server_contexts_send_no_session_tickets(self) -> None:
        # no client of ours resumes; a ticket costs the verifier 16 KB per
        # kept-alive connection to an agent until the next answer
        d = tempfile.mkdtemp()
        ca = CertificateAuthority.create(d, "test CA")
        ca.issue_to_files(d, "server", ["127.0.0.1"])
        ctx = tlsutil.server_context(
            os.path.join(d, "server.pem"),
            os.path.join(d, "server-key.pem"),
            os.path.join(d, "ca.pem"),
        )
        key, cert = tlsutil.self_signed_certificate("agent", ["127.0.0.1"])
        with open(os.path.join(d, "ca.pem")) as f:
            agent = tlsutil.server_context_from_pem(cert, key, f.read(), d)
        self.assertEqual((0, 0), (ctx.num_tickets, agent.num_tickets))
