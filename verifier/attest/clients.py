"""HTTP clients of the verifier: to the registrar and to node agents.

Both go through the one client (:mod:`verifier.common.http`); here its
:class:`~verifier.common.errors.TransportError` and refusals become the
verifier's errors. Agents present a self-signed certificate that the
registrar recorded at registration; we pin exactly that certificate
(:class:`verifier.common.agent_client.AgentClient`).
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import orjson

from verifier.common import agent_client
from verifier.common.errors import TransportError
from verifier.common.http import MAX_ANSWER, AsyncClient
from verifier.exceptions import AgentUnreachableError, NotFoundError, RequestError
from verifier.protocol import MalformedError
from verifier.protocol.messages.host_trust import HostTrustUpdate
from verifier.protocol.messages.registration import (
    AgentLookup,
    AgentLookupResult,
    RegistrationRecord,
)

__all__ = ["RegistrarClient", "VerifierAgentClient"]

LOG = logging.getLogger(__name__)

#: Nodes per look-up request: their records (EK certificates of up to 8 KiB
#: each) stay well inside the client's answer limit.
LOOKUP_BATCH = 200


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
        self._http = AsyncClient(ssl_context, timeout)

    async def get_agent(self, uuid: str) -> RegistrationRecord:
        """The registrar's record of ``uuid``.

        Raises:
            NotFoundError: the registrar does not know the node.
            RequestError: the registrar is unreachable or refused (502), or
                its record is malformed or of another node (502
                ``registrar_malformed``).
        """
        try:
            answer = await self._http.request("GET", f"{self._base}/v1/agents/{uuid}")
        except TransportError as exc:
            raise RequestError(
                "registrar_unreachable", f"cannot reach the registrar: {exc}", 502
            )
        if answer.status == 404:
            raise NotFoundError(
                "unknown_node", f"the registrar does not know node {uuid}"
            )
        if answer.status != 200:
            raise RequestError("registrar_error", answer.error.message, 502)
        return _record(uuid, answer.data)

    async def lookup(
        self, uuids: list[str]
    ) -> tuple[dict[str, RegistrationRecord], dict[str, str]]:
        """The registrar's records of those of ``uuids`` (canonical) it
        knows, and the compute hosts recorded for them, in requests of
        :data:`LOOKUP_BATCH` nodes (a batch of enrolments).

        Raises:
            RequestError: the registrar is unreachable or refused (502), or
                its answer is malformed or holds a node not asked for (502
                ``registrar_malformed``).
        """
        records: dict[str, RegistrationRecord] = {}
        hosts: dict[str, str] = {}
        url = f"{self._base}/v1/lookup/agents"
        for start in range(0, len(uuids), LOOKUP_BATCH):
            chunk = uuids[start : start + LOOKUP_BATCH]
            body = AgentLookup(tuple(chunk)).to_dict()
            try:
                answer = await self._http.request("POST", url, json=body)
            except TransportError as exc:
                raise RequestError(
                    "registrar_unreachable", f"cannot reach the registrar: {exc}", 502
                )
            if answer.status != 200:
                raise RequestError("registrar_error", answer.error.message, 502)
            try:
                result = AgentLookupResult.from_dict(answer.data)
            except MalformedError as exc:
                raise RequestError(
                    "registrar_malformed", f"the registrar's look-up: {exc}", 502
                )
            asked = set(chunk)
            got = {r.uuid: r for r in result.agents}
            if not asked.issuperset(got) or not asked.issuperset(result.placements):
                raise RequestError(
                    "registrar_malformed",
                    "the registrar's look-up answered for a node not asked for",
                    502,
                )
            records.update(got)
            hosts.update(result.placements)
        return records, hosts

    async def placement(self, uuid: str) -> str | None:
        """The compute host the registrar last recorded for instance
        ``uuid`` (from Nova's notifications, by the vTPM manager), or None
        when it has none or cannot say now (the Nova listener reports
        later moves to the verifier itself)."""
        url = f"{self._base}/v1/provider/instances/{uuid}"
        try:
            answer = await self._http.request("GET", url)
        except TransportError as exc:
            LOG.warning("No placement of %s from the registrar: %s", uuid, exc)
            return None
        data = answer.data if answer.ok else None
        host = data.get("host") if isinstance(data, Mapping) else None
        if answer.status != 404 and not answer.ok:
            LOG.warning(
                "No placement of %s from the registrar: %s", uuid, answer.status
            )
        return host if isinstance(host, str) and host else None

    async def put_host_trust(self, host: str, report: HostTrustUpdate) -> None:
        """Tell the registrar compute host ``host``'s trust (it accepts
        vTPM EK certificates from the host's CA only while it is trusted
        with that CA proven).

        Raises:
            RequestError: the registrar is unreachable (502
                ``registrar_unreachable``), has no CA enrolled for ``host``
                (502 ``registrar_unknown_host``) or refused (502
                ``registrar_error``): retry later.
        """
        url = f"{self._base}/v1/hosts/{quote(host, safe='')}/trust"
        try:
            answer = await self._http.request("PUT", url, json=report.to_dict())
        except TransportError as exc:
            raise RequestError(
                "registrar_unreachable", f"cannot reach the registrar: {exc}", 502
            )
        if not answer.ok:
            raise RequestError(
                "registrar_unknown_host" if answer.status == 404 else "registrar_error",
                f"the registrar answered {answer.status} to the trust of host "
                f"{host}: {answer.error.message}",
                502,
            )

    async def close(self) -> None:
        await self._http.close()


class VerifierAgentClient(agent_client.AgentClient):
    """The verifier's requests to node agents: a 2xx JSON object, or the
    verifier's errors.

    Connection lifetime: a node quoted often keeps its connection between
    rounds (a handshake costs more CPU than the request); a node quoted
    less often than every ``keep_alive`` seconds is disconnected after
    each round (:meth:`rest`), since an idle TLS connection costs tens of
    KB on each side and 100,000 of them would not fit a small verifier.

    Args:
        cert_file, key_file, timeout, max_answer: as
            :class:`verifier.common.agent_client.AgentClient`.
        keep_alive: the longest interval between rounds across which a
            connection is kept.
    """

    def __init__(
        self,
        cert_file: str,
        key_file: str,
        timeout: float,
        max_answer: int = MAX_ANSWER,
        keep_alive: float = 15.0,
    ) -> None:
        super().__init__(cert_file, key_file, timeout, max_answer)
        self.keep_alive = keep_alive

    def rest(self, base: str, delay: float) -> None:
        """The agent at ``base`` is asked again in ``delay`` seconds: keep
        its connection only if that is soon."""
        if delay > self.keep_alive:
            self.close_idle(base)

    async def call(
        self,
        method: str,
        base: str,
        agent_cert: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
    ) -> Mapping[str, Any]:
        """One request to an agent (arguments as in :meth:`request`).

        Raises:
            AgentUnreachableError: transport failure or a non-2xx answer.
            MalformedError: a 2xx answer that is not a JSON object (bad
                evidence: the node fails its check, it is not unreachable).
        """
        try:
            answer = await self.request(
                method,
                base,
                agent_cert,
                path,
                params=params,
                body=body,
                expect_json=False,  # a body that is not JSON is bad evidence
            )
        except TransportError as exc:
            raise AgentUnreachableError(f"agent {base} unreachable: {exc}")
        if not answer.ok:
            raise AgentUnreachableError(
                f"agent answered {answer.status} to {path}: {answer.error.message}"
            )
        try:
            data = orjson.loads(answer.body)
        except orjson.JSONDecodeError:
            raise MalformedError("agent answer", "response is not JSON")
        if not isinstance(data, dict):
            raise MalformedError("agent answer", "response is not a JSON object")
        return data
