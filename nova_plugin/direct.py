"""The tenant's direct path to a polled node's agent (``direct_agents``):
its own mTLS connection with a tenant certificate the agent accepts, the
agent's TLS certificate pinned from the registrar's record. The default
path goes through the verifier's relay instead (:mod:`nova_plugin.relay`);
this one remains for ``--direct-agents`` and for the agent's own APIs the
relay does not carry (``send-sealed``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nova_plugin.exceptions import AgentError, ServiceError
from verifier.common.agent_client import AgentClient
from verifier.common.errors import TransportError
from verifier.protocol.messages.registration import RegistrationRecord

__all__ = ["DirectAgents"]


class DirectAgents:
    """Calls to node agents with a tenant certificate.

    Args:
        cert_file, key_file: the tenant certificate and key (required).
        timeout: seconds per call.

    Raises:
        ServiceError: no certificate or key.
    """

    def __init__(
        self, cert_file: str | None, key_file: str | None, timeout: float
    ) -> None:
        if not cert_file or not key_file:
            raise ServiceError(
                "reaching agents directly needs a tenant certificate and key"
            )
        self._client = AgentClient(cert_file, key_file, timeout)

    async def close(self) -> None:
        await self._client.close()

    async def call(
        self,
        uuid: str,
        record: RegistrationRecord,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
    ) -> Any:
        """One call to a node's agent, its TLS certificate pinned from the
        registrar's ``record``; the JSON answer.

        Raises:
            AgentError: unreachable, another certificate, or a non-2xx answer.
        """
        try:
            answer = await self._client.request(
                method, record.base_url, record.tls_cert, path, params=params, body=body
            )
        except TransportError as exc:
            raise AgentError(f"node {uuid}: agent unreachable: {exc}")
        if not answer.ok:
            error = answer.error
            detail = f"{error.code}: {error.message}" if error.code else error.message
            raise AgentError(
                f"node {uuid}: agent answered {answer.status} to {path}: {detail}",
                answer.status,
                error.code,
            )
        return answer.data
