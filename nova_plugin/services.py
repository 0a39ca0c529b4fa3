"""The tenant's one way to call the registrar and the verifier.

A service the tenant was given a Keystone-session client for
(:class:`~nova_plugin.attestation.AttestationClient`, see
:mod:`nova_plugin.tenant_auth`) is called on that session; any other URL
over mTLS with the tenant certificate (the ``noauth`` demo). Either way
every failure is one :class:`~nova_plugin.exceptions.ServiceError` and
every answer a JSON object. Nodes' agents are not called here
(:mod:`nova_plugin.relay`, :mod:`nova_plugin.direct`).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping, Sequence
from typing import Any

from nova_plugin.attestation import AttestationClient
from nova_plugin.exceptions import ServiceError
from verifier.common.errors import TransportError
from verifier.common.http import AsyncClient

__all__ = ["ServiceClient"]

#: Seconds before each new try of a call a service answered with
#: ``503 database_busy`` (:mod:`verifier.db.busy`).
_BUSY_WAITS = (1.0, 2.0, 4.0)


class ServiceClient:
    """JSON calls to the registrar and the verifier.

    Args:
        context: the TLS context of the mTLS calls (the tenant
            certificate, if any, and the operator CA).
        timeout: seconds per mTLS call.
        sessions: (base URL, client) pairs: a URL under a base is called
            through its client, on the user's Keystone session, with the
            path below the base. An empty base or a None client is skipped.
    """

    def __init__(
        self,
        context: ssl.SSLContext,
        timeout: float,
        sessions: Sequence[tuple[str, AttestationClient | None]] = (),
    ) -> None:
        self._http = AsyncClient(context, timeout)
        self._sessions = [(base, c) for base, c in sessions if base and c is not None]

    async def close(self) -> None:
        await self._http.close()

    async def call(
        self, method: str, url: str, body: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """One call; the JSON object answered (empty for no body). A
        service whose database was busy (``503 database_busy``: nothing was
        changed) is asked again, after 1, 2 and 4 s.

        Raises:
            ServiceError: unreachable, a non-2xx answer (with the service's
                status and error code), or an answer that is not an object.
        """
        for wait in (*_BUSY_WAITS, None):
            try:
                data = await self._call(method, url, body)
                break
            except ServiceError as exc:
                busy = exc.status == 503 and exc.code == "database_busy"
                if not busy or wait is None:
                    raise
            await asyncio.sleep(wait)
        if data is not None and not isinstance(data, dict):
            raise ServiceError(f"{method} {url}: the answer is not a JSON object")
        return data or {}

    async def _call(self, method: str, url: str, body: Mapping[str, Any] | None) -> Any:
        for base, client in self._sessions:
            if url.startswith(base):
                path = url[len(base) :]
                return await asyncio.to_thread(client.call, method, path, body)
        try:
            answer = await self._http.request(method, url, json=body)
        except TransportError as exc:
            raise ServiceError(str(exc))
        if not answer.ok:
            error = answer.error
            raise ServiceError(
                f"{method} {url}: {answer.status} {error.message}",
                answer.status,
                error.code,
            )
        return answer.data
