"""The verifier's connection policy towards agents (issue 19, memory at
scale): a node quoted often keeps its mutual-TLS connection between
rounds; one quoted less often than ``keep_alive`` is disconnected after
each round, so that a slowly watched fleet holds no idle connections.

Against a real loopback aiohttp server over mutual TLS (the fixture of
:mod:`verifier.tests.unit.test_http_client`), which records the client
address of each request: one address per connection.
"""

from __future__ import annotations

import asyncio
import os

from verifier.attest.clients import VerifierAgentClient
from verifier.tests.unit.test_http_client import _Base


class AgentConnectionPolicyTest(_Base):
    def _rounds(self, delay: float, rounds: int = 3) -> int:
        """Connections used by ``rounds`` requests to one agent, told after
        each that the next comes in ``delay`` seconds."""
        del self.fx.peers[:]
        with open(os.path.join(self.fx.dir, "server.pem")) as f:
            agent_cert = f.read()
        base = self.fx.tls_url

        async def main() -> None:
            client = VerifierAgentClient(*self.fx.client, timeout=10.0, keep_alive=15.0)
            try:
                for i in range(rounds):
                    answer = await client.call(
                        "GET", base, agent_cert, "/q", params={"i": str(i)}
                    )
                    self.assertEqual({"i": str(i)}, answer)
                    client.rest(base, delay)
            finally:
                await client.close()

        asyncio.run(main())
        self.assertEqual(rounds, len(self.fx.peers))
        return len(set(self.fx.peers))

    def test_a_node_quoted_often_keeps_its_connection(self) -> None:
        self.assertEqual(1, self._rounds(delay=2.0))

    def test_a_node_quoted_rarely_is_reconnected_each_round(self) -> None:
        self.assertEqual(3, self._rounds(delay=60.0))

    def test_the_threshold_is_the_keep_alive(self) -> None:
        self.assertEqual(1, self._rounds(delay=15.0))
        self.assertEqual(2, self._rounds(delay=15.01, rounds=2))
