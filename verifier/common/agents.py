"""The one client to node agents, shared by the verifier's quote loop and
the tenant tools.

Agents present a self-signed certificate that the registrar recorded at
registration; we pin exactly that certificate. Each agent gets one
kept-alive connection (see :mod:`verifier.common._http`): the verifier
sends one small request per node per round.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import orjson

from verifier.common import tls as tlsutil
from verifier.common._http import HttpError, KeepAliveClient
from verifier.common.errors import AgentUnreachableError
from verifier.protocol import MalformedError

__all__ = ["AgentClient"]


class AgentClient:
    """Talks to node agents with a pinned TLS context per agent certificate,
    over one kept-alive connection per agent.

    Args:
        cert_file: our client certificate (PEM).
        key_file: its private key (PEM).
        timeout: seconds per request.
    """

    def __init__(self, cert_file: str, key_file: str, timeout: float):
        self._cert = cert_file
        self._key = key_file
        self._http = KeepAliveClient(timeout)
        self._ctx: ssl.SSLContext | None = None
        self._pins: dict[str, bytes] = {}
        self._addresses: dict[str, tuple[str, int]] = {}

    def _context(self) -> ssl.SSLContext:
        if self._ctx is None:
            self._ctx = tlsutil.pinning_client_context(self._cert, self._key)
        return self._ctx

    def _pin(self, agent_cert: str) -> bytes:
        pin = self._pins.get(agent_cert)
        if pin is None:
            try:
                pin = self._pins[agent_cert] = tlsutil.pinned_der(agent_cert)
            except ValueError:
                raise AgentUnreachableError("the agent's registered certificate is bad")
        return pin

    def _address(self, base: str) -> tuple[str, int]:
        address = self._addresses.get(base)
        if address is None:
            url = urlsplit(base)
            if url.scheme != "https" or not url.hostname or not url.port:
                raise AgentUnreachableError(f"not an https://host:port URL: {base}")
            address = self._addresses[base] = (url.hostname, url.port)
        return address

    async def request(
        self,
        method: str,
        base: str,
        agent_cert: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
    ) -> Mapping[str, Any]:
        """One request to an agent.

        Raises:
            AgentUnreachableError: transport failure or a non-2xx answer.
            MalformedError: a 2xx answer that is not a JSON object.
        """
        host, port = self._address(base)
        data = orjson.dumps(body) if body is not None else None
        try:
            status, payload = await self._http.request(
                method,
                host,
                port,
                self._context(),
                path,
                params,
                data,
                self._pin(agent_cert),
            )
        except HttpError as exc:
            raise AgentUnreachableError(f"agent {base} unreachable: {exc}")
        if status // 100 != 2:
            text = payload[:300].decode(errors="replace")
            raise AgentUnreachableError(f"agent answered {status} to {path}: {text}")
        try:
            answer = orjson.loads(payload)
        except orjson.JSONDecodeError:
            raise MalformedError("agent answer", "response is not JSON")
        if not isinstance(answer, dict):
            raise MalformedError("agent answer", "response is not a JSON object")
        return answer

    def forget(self, base: str, agent_cert: str) -> None:
        """Close the kept-alive connection to an agent we stop attesting."""
        address = self._addresses.pop(base, None)
        if address is not None:
            self._http.drop(*address)
        self._pins.pop(agent_cert, None)

    async def close(self) -> None:
        await self._http.close()
