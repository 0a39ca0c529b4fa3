"""HTTP clients of the verifier: to the registrar and to node agents.

Both keep connections alive in one aiohttp session. Agents present a
self-signed certificate that the registrar recorded at registration; we pin
exactly that certificate.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson

from verifier.attest._http import HttpError, KeepAliveClient
from verifier.common import tls as tlsutil
from verifier.exceptions import AgentUnreachableError, NotFoundError, RequestError
from verifier.protocol import MalformedError
from verifier.protocol.messages.registration import RegistrationRecord


async def _json(resp: aiohttp.ClientResponse, what: str) -> Mapping[str, Any]:
    try:
        data = await resp.json(content_type=None)
    except (ValueError, aiohttp.ContentTypeError):
        raise MalformedError(what, "response is not JSON")
    if not isinstance(data, dict):
        raise MalformedError(what, "response is not a JSON object")
    return data


def _error_message(data: Mapping[str, Any]) -> str:
    err = data.get("error")
    if isinstance(err, dict):
        return str(err.get("message", err))
    return str(data)


def _record(uuid: str, data: Mapping[str, Any]) -> RegistrationRecord:
    """The registrar's answer for ``uuid``, parsed and checked to be of it."""
    try:
        record = RegistrationRecord.from_dict(data)
        record.check_node(uuid)
    except MalformedError as exc:
        raise RequestError(
            "registrar_malformed", f"the registrar's record of {uuid}: {exc}", 502
        )
    return record


class RegistrarClient:
    """Reads activated node identities from the registrar over mTLS."""

    def __init__(self, base_url: str, ssl_context: ssl.SSLContext, timeout: float):
        self._base = base_url.rstrip("/")
        self._ssl = ssl_context
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self._session

    async def get_agent(self, uuid: str) -> RegistrationRecord:
        """The registrar's record of ``uuid``.

        Raises:
            NotFoundError: the registrar does not know the node.
            RequestError: the registrar is unreachable or refused (502), or
                its record is malformed or of another node (502
                ``registrar_malformed``).
        """
        url = f"{self._base}/v1/agents/{uuid}"
        try:
            async with self._get_session().get(url, ssl=self._ssl) as resp:
                data = await _json(resp, "registrar answer")
                if resp.status == 404:
                    raise NotFoundError(
                        "unknown_node", f"the registrar does not know node {uuid}"
                    )
                if resp.status != 200:
                    raise RequestError("registrar_error", _error_message(data), 502)
        except (TimeoutError, aiohttp.ClientError, MalformedError) as exc:
            raise RequestError(
                "registrar_unreachable", f"cannot reach the registrar: {exc}", 502
            )
        return _record(uuid, data)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


class AgentClient:
    """Talks to node agents with a pinned TLS context per agent certificate,
    over one kept-alive connection per agent (see :mod:`._http`)."""

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
