"""The fleet emulator's injected round-trip time (issue 19, latency): the
answer to a quote is held back by the RTT set through the control route,
answers keep their order on a kept-alive connection, and a bad RTT is
refused with the emulator's JSON error. Loopback only (the emulated
agent's own address, 127.1.0.1), plain TCP: the TLS layer is not what
these tests are about."""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.parse

import fixtures
import testtools

from trusted_testing.fleet import Fleet, _HttpProtocol, _parse_query
from verifier.protocol.errors import EvidenceError
from verifier.protocol.messages.quote import QuoteAnswer
from verifier.protocol.policy import PcrPolicy
from verifier.protocol.quote import AttestationKey, bind_nonce, verify_quote
from verifier.protocol.tpm import TpmSignature


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


class FleetQuoteTest(testtools.TestCase):
    """The emulator's cheaper quote path (parts kept between quotes) gives
    the answer the structured build gives, and the real verification
    accepts it over fresh nonces and refuses it on a changed PCR."""

    def setUp(self) -> None:
        super().setUp()
        workdir = self.useFixture(fixtures.TempDir()).path
        self.fleet = Fleet(1, 0, "/nonexistent-ca.pem", workdir)
        self.agent = self.fleet.agents[0]
        self.ak = AttestationKey(self.agent.tpm.ak, activated=True)

    def ask(self, nonce: bytes, pcrs: str = "16") -> dict:  # type: ignore[type-arg]
        status, answer = self.fleet.handle(
            "GET",
            "/v1/quote",
            _parse_query(f"nonce={nonce.hex()}&pcrs={pcrs}&csr=0"),
            b"",
            self.agent.address,
            "127.0.0.1",
        )
        self.assertEqual(200, status, answer)
        return dict(answer)

    def judge(self, answer: dict, nonce: bytes, good: bytes) -> None:  # type: ignore[type-arg]
        parsed = QuoteAnswer.from_dict(answer)
        self.assertEqual(answer, parsed.to_dict())  # the message's own form
        verify_quote(
            parsed.quote,
            ak=self.ak,
            qualifying_data=bind_nonce(nonce, self.agent.nk_public),
            policy=PcrPolicy({16: frozenset({good})}),
        )

    def test_answers_pass_the_real_verification_with_fresh_nonces(self) -> None:
        good = self.agent.tpm.pcrs[16]
        for _ in range(3):
            nonce = os.urandom(20)
            self.judge(self.ask(nonce), nonce, good)
        self.assertEqual(3, self.agent.quotes)

    def test_a_changed_pcr_is_quoted_not_the_kept_one(self) -> None:
        good = self.agent.tpm.pcrs[16]
        self.ask(os.urandom(20))  # the kept parts now hold the old value
        self.fleet.handle(
            "POST",
            "/_fleet/tamper",
            {},
            json.dumps({"uuid": self.agent.uuid}).encode(),
            "127.0.0.1",
            "127.0.0.1",
        )
        nonce = os.urandom(20)
        answer = self.ask(nonce)
        self.assertNotEqual(good.hex(), answer["quote"]["pcrs"]["16"])
        error = self.assertRaises(EvidenceError, self.judge, answer, nonce, good)
        self.assertEqual("pcr_policy", error.reason)  # digest matches values
        self.agent.tpm.pcrs[16] = good  # assigned directly, as tests do
        nonce = os.urandom(20)
        self.judge(self.ask(nonce), nonce, good)

    def test_kept_parts_give_the_structured_attest(self) -> None:
        tpm = self.agent.tpm
        for pcrs in ((16,), (0, 7, 16), (16, 16, 3)):
            qd = os.urandom(32)
            clock = tpm.clock
            fast = tpm.quote(qd, pcrs)
            tpm.clock = clock
            slow = tpm.quote_structured(qd, pcrs)
            self.assertEqual(slow.attest, fast.attest, str(pcrs))
            self.assertEqual(slow.pcr_values, fast.pcr_values)
            self.assertEqual(  # ECDSA signatures differ; their form does not
                TpmSignature.from_bytes(slow.signature).sig_alg,
                TpmSignature.from_bytes(fast.signature).sig_alg,
            )
            self.assertEqual(len(slow.signature), len(fast.signature))

    def test_query_parsing_matches_parse_qsl(self) -> None:
        for qs in (
            "nonce=ab&pcrs=16&csr=0",
            "nonce=ab&pcrs=16%2C17&csr=1",
            "nonce=&pcrs=16",
            "a=1&a=2&&b",
            "x=1+2",
            "",
        ):
            self.assertEqual(dict(urllib.parse.parse_qsl(qs)), _parse_query(qs), qs)
