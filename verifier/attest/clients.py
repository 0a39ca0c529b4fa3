"""HTTP clients of the verifier: to the registrar (here, one kept-alive
aiohttp session) and to node agents (the shared
:class:`verifier.common.agents.AgentClient`, re-exported here).
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any

import aiohttp

from verifier.common.agents import AgentClient
from verifier.exceptions import NotFoundError, RequestError
from verifier.protocol import MalformedError
from verifier.protocol.messages.registration import RegistrationRecord

__all__ = ["AgentClient", "RegistrarClient"]


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
