"""Requests to node agents, each agent's TLS certificate pinned.

An agent presents a self-signed certificate that the registrar recorded
when the agent registered; the verifier and the tenant accept exactly that
certificate (compared byte for byte right after the handshake, before any
request is sent) and present their own operator certificate. One TLS
context serves every agent, and one kept-alive connection per agent
carries the quote loop (:class:`verifier.common.http.AsyncClient`).
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any

from verifier.common import tls as tlsutil
from verifier.common.errors import TransportError
from verifier.common.http import MAX_ANSWER, Answer, AsyncClient

__all__ = ["AgentClient"]


class AgentClient:
    """Talks to node agents over mutual TLS with pinned agent certificates.

    Args:
        cert_file: our client certificate (PEM), e.g. the verifier's.
        key_file: its private key.
        timeout: seconds for one whole exchange.
        max_answer: the largest answer accepted (an IMA list part and a
            firmware log fit in the default).
    """

    def __init__(
        self,
        cert_file: str,
        key_file: str,
        timeout: float,
        max_answer: int = MAX_ANSWER,
    ) -> None:
        self._cert = cert_file
        self._key = key_file
        self._timeout = timeout
        self._max_answer = max_answer
        self._http: AsyncClient | None = None
        self._pins: dict[str, bytes] = {}

    def _client(self) -> AsyncClient:
        if self._http is None:
            try:
                ctx = tlsutil.pinning_client_context(self._cert, self._key)
            except (OSError, ssl.SSLError) as exc:
                raise TransportError(f"cannot load our client certificate: {exc}")
            # one idle connection per agent: requests to one agent are rare
            # to overlap, and thousands of agents share the process
            self._http = AsyncClient(ctx, self._timeout, self._max_answer, max_idle=1)
        return self._http

    def _pin(self, agent_cert: str) -> bytes:
        pin = self._pins.get(agent_cert)
        if pin is None:
            try:
                pin = self._pins[agent_cert] = tlsutil.pinned_der(agent_cert)
            except ValueError:
                raise TransportError("the agent's registered certificate is bad")
        return pin

    async def request(
        self,
        method: str,
        base: str,
        agent_cert: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
        expect_json: bool = True,
    ) -> Answer:
        """One request to an agent; its answer whatever the status.

        Args:
            method: the HTTP method.
            base: the agent's ``https://host:port``.
            agent_cert: the agent's registered certificate (PEM), pinned.
            path: the route, e.g. ``/v1/quote``.
            params: query parameters.
            body: the JSON body.
            expect_json: a 2xx body that is not JSON is a transport error
                (False: the caller judges the raw body itself).

        Raises:
            TransportError: unreachable, not the pinned certificate, not
                JSON (when expected), too large, or a bad registered
                certificate.
        """
        client = self._client()
        return await client.request(
            method,
            base + path,
            params=params,
            json=body,
            pin=self._pin(agent_cert),
            expect_json=expect_json,
        )

    def close_idle(self, base: str) -> None:
        """Close the kept-alive connection to an agent (its pinned
        certificate stays known: the next request reconnects)."""
        if self._http is not None:
            self._http.forget(base)

    def forget(self, base: str, agent_cert: str) -> None:
        """Close the kept-alive connection to an agent we stop talking to."""
        if self._http is not None:
            self._http.forget(base)
        self._pins.pop(agent_cert, None)

    async def close(self) -> None:
        """Close every connection."""
        if self._http is not None:
            await self._http.close()
