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

    Two kinds of call go this way. The agent's own APIs the relay does not
    carry (:meth:`call`) may be called whenever the tenant has a
    certificate. A node's bootstrap, its identity quote over the tenant's
    nonce and U (:meth:`bootstrap_call`), goes this way only when the
    tenant chose the direct path (``bootstrap``, from
    ``TenantConfig.direct_agents``): otherwise it goes through the
    verifier's relay, however many other calls were made here before.

    Args:
        cert_file, key_file: the tenant certificate and key (every call
            needs them).
        timeout: seconds per call.
        bootstrap: the direct path is chosen for the bootstrap.

    Raises:
        ServiceError: ``bootstrap`` without a certificate or key.
    """

    def __init__(
        self,
        cert_file: str | None,
        key_file: str | None,
        timeout: float,
        *,
        bootstrap: bool = False,
    ) -> None:
        self._cert_file, self._key_file = cert_file, key_file
        self._timeout = timeout
        self._bootstrap = bootstrap
        self._client: AgentClient | None = None
        if bootstrap:  # a missing certificate shows at once
            self._agent_client()

    def _agent_client(self) -> AgentClient:
        """The mTLS client, made on first use.

        Raises:
            ServiceError: no certificate or key.
        """
        if self._client is None:
            if not self._cert_file or not self._key_file:
                raise ServiceError(
                    "reaching agents directly needs a tenant certificate and key"
                )
            self._client = AgentClient(self._cert_file, self._key_file, self._timeout)
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()

    async def bootstrap_call(
        self,
        uuid: str,
        record: RegistrationRecord,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
    ) -> Any:
        """A call of a node's bootstrap (the identity quote, U) on the
        direct path; as :meth:`call`.

        Raises:
            AgentError: the direct path was not chosen (``bootstrap``), or
                as :meth:`call`.
        """
        if not self._bootstrap:
            raise AgentError(
                f"node {uuid}: agents are reached through the verifier's relay "
                "(no direct_agents)"
            )
        return await self.call(uuid, record, method, path, params=params, body=body)

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
            ServiceError: no tenant certificate or key.
            AgentError: unreachable, another certificate, or a non-2xx answer.
        """
        try:
            answer = await self._agent_client().request(
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
