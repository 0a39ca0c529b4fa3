"""Transport failures on the services' event loop are one log line, not a
traceback (issue 19: ~800 "Fatal error on SSL protocol" tracebacks a
minute in the verifier's log under overload), and real bugs keep theirs
(:mod:`verifier.common.loop_errors`).

The storm test runs through the services' own entry point
(``verifier.cmd._service.run``, uvloop) against a real TLS peer in another
thread that answers at once or resets the connection mid-answer, while
the client's loop is overloaded (it stalls) and gives up on exchanges
(short timeout): uvloop then reports failures from its own TLS code to
the loop's exception handler, as in the soak.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import ssl
import struct
import tempfile
import threading
import time
from typing import Any

import testtools

from verifier.cmd import _service
from verifier.common import loop_errors
from verifier.common.http import AsyncClient
from verifier.common.tls import self_signed_certificate

_ANSWER = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
)
_MAX_ROUNDS = 150  # storm rounds before giving up provoking a failure
_PER_ROUND = 100


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _reset(transport: asyncio.BaseTransport) -> None:
    """Abort with a TCP RST (SO_LINGER 0), as a crashing peer does."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


class _Peer(asyncio.Protocol):
    """Answers each request at once, or resets the connection mid-answer."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: Any = transport

    def data_received(self, data: bytes) -> None:
        if random.random() < 0.2:
            self.transport.write(_ANSWER[:40])
            _reset(self.transport)
        else:
            self.transport.write(_ANSWER)


class _BugError(Exception):
    pass


class _BuggyClient(asyncio.Protocol):
    """A protocol with a bug: it raises on the first bytes it receives."""

    def __init__(self, lost: asyncio.Future[None]) -> None:
        self.lost = lost

    def data_received(self, data: bytes) -> None:
        raise _BugError("a bug in a protocol")

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)


class _Greeter(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.write(b"hello")  # type: ignore[attr-defined]


class _PemFiles:
    """The key and certificate in PEM files while in the block."""

    def __init__(self, key: bytes, cert: bytes) -> None:
        self._dir = tempfile.TemporaryDirectory()
        self.key = f"{self._dir.name}/key.pem"
        self.cert = f"{self._dir.name}/cert.pem"
        with open(self.key, "wb") as f:
            f.write(key)
        with open(self.cert, "wb") as f:
            f.write(cert)

    def __enter__(self) -> tuple[str, str]:
        return self.key, self.cert

    def __exit__(self, *exc: object) -> None:
        self._dir.cleanup()


class TlsPeerThread:
    """A TLS server on 127.0.0.1 on its own asyncio loop and thread."""

    def __init__(self, protocol: type[asyncio.Protocol]) -> None:
        key, cert = self_signed_certificate("localhost", ["127.0.0.1"])
        self.server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        with _PemFiles(key, cert) as (key_file, cert_file):
            self.server_ctx.load_cert_chain(cert_file, key_file)
        self.client_ctx = ssl.create_default_context(cadata=cert.decode())
        self._loop = asyncio.new_event_loop()
        started = threading.Event()
        self.port = 0

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            server = self._loop.run_until_complete(
                self._loop.create_server(protocol, "127.0.0.1", 0, ssl=self.server_ctx)
            )
            self.port = server.sockets[0].getsockname()[1]
            started.set()
            self._loop.run_forever()
            server.close()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        started.wait(30)

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)


class LoopErrorsTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.logged = _Records()
        root = logging.getLogger()
        old_level = root.level
        root.addHandler(self.logged)
        root.setLevel(logging.DEBUG)
        self.addCleanup(root.setLevel, old_level)
        self.addCleanup(root.removeHandler, self.logged)

    def _failures_reported(self) -> int:
        """Transport failures reported on the loop: one-line records of the
        new handler, or the default handler's "Fatal error" records."""
        return sum(
            1
            for r in self.logged.records
            if r.name == loop_errors.__name__
            and r.levelno == logging.DEBUG
            or r.getMessage().startswith(("Fatal error", "SSL handshake failed"))
        )

    def _storm(self, client_kind: str, until_reported: bool) -> dict[str, Any]:
        """Exchanges with a peer that answers or resets, on an overloaded
        services' loop (it stalls), each given up after 50 ms; ``loop``:
        over the loop's own TLS transport (as the HTTP client did before it
        ran TLS itself, and as the services' servers still do), ``client``:
        through :class:`AsyncClient`."""
        peer = TlsPeerThread(_Peer)
        self.addCleanup(peer.stop)
        outcome: dict[str, Any] = {}

        async def storm() -> None:
            loop = asyncio.get_running_loop()
            outcome["handler"] = loop.get_exception_handler()
            client = AsyncClient(peer.client_ctx, timeout=0.05)
            url = f"https://127.0.0.1:{peer.port}/v1/quote"
            stalling = True

            def stall() -> None:  # an overloaded loop: long iterations
                time.sleep(random.random() * 0.2)
                if stalling:
                    loop.call_later(0.01, stall)

            async def over_the_loop() -> None:
                transport = None
                try:
                    async with asyncio.timeout(0.05):
                        transport, _ = await loop.create_connection(
                            asyncio.Protocol,
                            "127.0.0.1",
                            peer.port,
                            ssl=peer.client_ctx,
                        )
                        transport.write(b"GET /v1/quote HTTP/1.1\r\nHost: x\r\n\r\n")
                        await asyncio.sleep(1)  # the answer is never awaited
                finally:
                    if transport is not None:
                        transport.abort()

            async def exchange() -> None:
                try:
                    if client_kind == "loop":
                        await over_the_loop()
                    else:
                        await client.request("GET", url)
                except Exception as exc:  # failed exchanges are expected
                    outcome.setdefault("errors", set()).add(type(exc).__name__)

            stall()
            rounds = 0
            while rounds < _MAX_ROUNDS and not (
                until_reported and self._failures_reported()
            ):
                await asyncio.gather(*[exchange() for _ in range(_PER_ROUND)])
                rounds += 1
                if not until_reported and rounds >= 20:
                    break
            stalling = False
            await asyncio.sleep(0.3)  # reports of the last round
            await client.close()
            outcome["rounds"] = rounds

        self.assertEqual(0, _service.run(storm))
        return outcome

    def test_http_client_tls_reports_nothing_to_the_loop(self) -> None:
        """The HTTP client runs TLS itself: its failed exchanges are its
        callers' TransportErrors and nothing reaches the loop's handler."""
        outcome = self._storm("client", until_reported=False)
        self.assertIn("TransportError", outcome.get("errors", set()))
        self.assertEqual(0, self._failures_reported())
        self.assertEqual([], [r for r in self.logged.records if r.exc_info])

    def test_tls_exchanges_failing_under_overload_log_one_line_not_a_traceback(
        self,
    ) -> None:
        outcome = self._storm("loop", until_reported=True)
        self.assertGreater(
            self._failures_reported(),
            0,
            f"no transport failure provoked in {outcome['rounds']} rounds",
        )
        tracebacks = [r.getMessage()[:80] for r in self.logged.records if r.exc_info]
        self.assertEqual([], tracebacks)
        # the services' loop runs the handler
        self.assertIsInstance(outcome["handler"], loop_errors.TransportFailureLog)
        mine = [r for r in self.logged.records if r.name == loop_errors.__name__]
        lines = [r for r in mine if r.levelno == logging.DEBUG]
        summaries = [r for r in mine if r.levelno == logging.WARNING]
        self.assertEqual(outcome["handler"].count, len(lines))
        self.assertEqual(1, len(summaries))  # one a minute at most
        for record in lines:
            self.assertNotIn("\n", record.getMessage())
            self.assertIn("Fatal error on SSL protocol", record.getMessage())

    def test_a_bug_in_a_protocol_keeps_its_traceback(self) -> None:
        peer = TlsPeerThread(_Greeter)
        self.addCleanup(peer.stop)
        outcome: dict[str, Any] = {}

        async def connect() -> None:
            loop = asyncio.get_running_loop()
            outcome["handler"] = loop.get_exception_handler()
            lost: asyncio.Future[None] = loop.create_future()
            await loop.create_connection(
                lambda: _BuggyClient(lost),
                "127.0.0.1",
                peer.port,
                ssl=peer.client_ctx,
            )
            await lost

        self.assertEqual(0, _service.run(connect))
        bugs = [
            r
            for r in self.logged.records
            if r.exc_info and isinstance(r.exc_info[1], _BugError)
        ]
        self.assertEqual(1, len(bugs))
        self.assertEqual(logging.ERROR, bugs[0].levelno)
        self.assertIsInstance(outcome["handler"], loop_errors.TransportFailureLog)
        self.assertEqual(0, outcome["handler"].count)


class TransportFailureLogTest(testtools.TestCase):
    """The handler's sorting and its summary, on reports built here."""

    def setUp(self) -> None:
        super().setUp()
        self.passed: list[dict[str, Any]] = []
        self.now = 1000.0
        self.handler = loop_errors.TransportFailureLog(
            lambda loop, context: self.passed.append(context),
            interval=60.0,
            clock=lambda: self.now,
        )
        self.logged = _Records()
        logger = logging.getLogger(loop_errors.__name__)
        logger.addHandler(self.logged)
        old_level = logger.level
        logger.setLevel(logging.DEBUG)
        self.addCleanup(logger.setLevel, old_level)
        self.addCleanup(logger.removeHandler, self.logged)

    def _report(self, exc: BaseException, **extra: Any) -> None:
        context = {"message": "Fatal error on SSL protocol", "exception": exc}
        context.update(extra)
        self.handler(None, context)  # type: ignore[arg-type]

    def test_connection_errors_of_a_transport_are_counted_and_summed_up(
        self,
    ) -> None:
        for _ in range(5):
            self._report(ConnectionResetError(104, "reset"), transport=object())
        self.now += 61
        self._report(ssl.SSLError(1, "alert"), protocol=object())
        self.assertEqual([], self.passed)
        self.assertEqual(6, self.handler.count)
        warnings = [
            r.getMessage() for r in self.logged.records if r.levelno == logging.WARNING
        ]
        self.assertEqual(2, len(warnings))
        self.assertTrue(warnings[0].startswith("1 connection(s)"))
        self.assertTrue(warnings[1].startswith("5 connection(s)"))

    def test_an_exception_from_python_code_is_passed_on(self) -> None:
        try:
            raise RuntimeError("a protocol bug")
        except RuntimeError as exc:
            self._report(exc, transport=object())
        self.assertEqual(1, len(self.passed))
        self.assertEqual(0, self.handler.count)

    def test_a_report_without_a_transport_is_passed_on(self) -> None:
        self._report(ConnectionResetError(104, "reset"), future=object())
        self.assertEqual(1, len(self.passed))
        self.assertEqual([], self.logged.records)
