"""The fleet emulator's injected round-trip time (issue 19, latency): the
answer to a quote is held back by the RTT set through the control route,
answers keep their order on a kept-alive connection, and a bad RTT is
refused with the emulator's JSON error. Loopback only (the emulated
agent's own address, 127.1.0.1), plain TCP: the TLS layer is not what
these tests are about."""

from __future__ import annotations

import asyncio
import json
import time

import fixtures
import testtools

from trusted_testing.fleet import Fleet, _HttpProtocol


def _request(method: str, target: str, body: bytes = b"") -> bytes:
    return (
        f"{method} {target} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def _answers(reader: asyncio.StreamReader, count: int) -> list[tuple[int, dict]]:  # type: ignore[type-arg]
    out = []
    for _ in range(count):
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        length = next(
            int(line.split(":")[1])
            for line in lines
            if line.startswith("Content-Length")
        )
        out.append(
            (int(lines[0].split()[1]), json.loads(await reader.readexactly(length)))
        )
    return out


class FleetRttTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        workdir = self.useFixture(fixtures.TempDir()).path
        self.fleet = Fleet(1, 0, "/nonexistent-ca.pem", workdir)
        self.agent = self.fleet.agents[0]

    def exchange(self, *requests: bytes) -> tuple[list[tuple[int, dict]], float]:  # type: ignore[type-arg]
        async def main() -> tuple[list[tuple[int, dict]], float]:  # type: ignore[type-arg]
            loop = asyncio.get_running_loop()
            server = await loop.create_server(
                lambda: _HttpProtocol(self.fleet), self.agent.address, 0
            )
            port = server.sockets[0].getsockname()[1]
            try:
                reader, writer = await asyncio.open_connection(self.agent.address, port)
                t0 = time.monotonic()
                writer.write(b"".join(requests))
                answers = await asyncio.wait_for(_answers(reader, len(requests)), 30)
                elapsed = time.monotonic() - t0
                writer.close()
                return answers, elapsed
            finally:
                server.close()

        return asyncio.run(main())

    def set_rtt(self, rtt: object) -> tuple[int, dict]:  # type: ignore[type-arg]
        body = json.dumps({"rtt": rtt}).encode()
        return self.fleet.handle(
            "POST", "/_fleet/rtt", {}, body, "127.0.0.1", "127.0.0.1"
        )

    def quote_request(self) -> bytes:
        return _request("GET", f"/v1/quote?nonce={'ab' * 20}&pcrs=16&csr=0")

    def test_answers_are_held_back_by_the_rtt(self) -> None:
        self.assertEqual((200, {"rtt": 0.3}), self.set_rtt(0.3))
        answers, elapsed = self.exchange(self.quote_request())
        self.assertEqual(200, answers[0][0])
        self.assertIn("quote", answers[0][1])
        # a lower bound only: whatever the load, the answer cannot come sooner
        self.assertGreaterEqual(elapsed, 0.3)
        self.assertEqual(1, self.agent.quotes)

    def test_held_back_answers_keep_their_order(self) -> None:
        self.set_rtt(0.05)
        answers, _ = self.exchange(
            self.quote_request(),
            _request("GET", "/v1/status"),
            _request("GET", "/v1/nothing-here"),
        )
        self.assertEqual([200, 200, 404], [status for status, _ in answers])
        self.assertIn("quote", answers[0][1])
        self.assertEqual(self.agent.uuid, answers[1][1]["uuid"])

    def test_rtt_zero_answers_at_once_again(self) -> None:
        self.set_rtt(5)
        self.assertEqual((200, {"rtt": 0.0}), self.set_rtt(0))
        answers, _ = self.exchange(_request("GET", "/v1/status"))
        self.assertEqual(200, answers[0][0])
        self.assertEqual(0.0, self.fleet.rtt)

    def test_bad_rtt_is_refused_and_the_old_one_kept(self) -> None:
        self.set_rtt(0.1)
        for bad in (-1, 11, "0.1", True, None):
            status, body = self.set_rtt(bad)
            self.assertEqual(400, status, bad)
            self.assertEqual("bad_rtt", body["error"]["code"])
        self.assertEqual(0.1, self.fleet.rtt)
