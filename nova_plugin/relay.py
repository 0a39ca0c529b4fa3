"""The tenant's side of the relay to its nodes
(:mod:`verifier.protocol.relay`): the identity quote over the tenant's
nonce and U (sealed to the quoted NK) go through the verifier's
project-scoped API, so the tenant needs neither a route to the node nor a
certificate its agent accepts. A push node gets them with its next
challenge and answer; a polled node's agent from the verifier on its own
mTLS connection. The tenant trusts the verifier with neither: it checks
the quote itself and U is opaque to the verifier.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from nova_plugin.exceptions import AgentError, ServiceError
from verifier.protocol import MalformedError
from verifier.protocol.messages.quote import QuoteRequest
from verifier.protocol.messages.relay import IdentityAsk, IdentityRelayed, URelayStatus
from verifier.protocol.messages.shares import ShareU

__all__ = ["PushRelay"]

Call = Callable[[str, str, Mapping[str, Any] | None], Awaitable[dict[str, Any]]]
_POLL = 0.25


class PushRelay:
    """Asks the verifier to relay to a node (push or pull).

    Args:
        call: one verifier call (method, URL, body) -> the JSON object
            answered (:meth:`nova_plugin.services.ServiceClient.call`).
        verifier_url: the verifier's base URL.
        timeout: seconds to wait for the node (it answers with the
            evidence after its next one: allow two of the verifier's quote
            intervals and a session).
    """

    def __init__(self, call: Call, verifier_url: str, timeout: float = 180.0) -> None:
        self._call = call
        self._base = verifier_url
        self.timeout = timeout

    def _url(self, uuid: str, what: str) -> str:
        return f"{self._base}/v1/nodes/{uuid}/relay/{what}"

    async def first_verdict(self, uuid: str, state: str, wait: float) -> str:
        """The state of a polled node just enrolled once the verifier has
        judged its first quote (it quotes a new node at once), waiting at
        most ``wait`` seconds while it is still ``registered``. The tenant
        asks for its identity quote only then: U never goes to a node whose
        first quote the verifier refused, and the tenant's enrolment fails
        with the verifier's reason instead of succeeding for a node revoked
        a moment later.

        Raises:
            ServiceError: the verifier did not answer.
        """
        deadline = time.monotonic() + wait
        while state == "registered" and time.monotonic() < deadline:
            await asyncio.sleep(_POLL / 5)
            data = await self._call("GET", f"{self._base}/v1/nodes/{uuid}", None)
            state = str(data.get("state", ""))
        return state

    async def identity(self, uuid: str, request: QuoteRequest) -> Mapping[str, Any]:
        """The node's identity answer to ``request`` (the tenant's nonce),
        unchecked: the caller checks it.

        Raises:
            ServiceError: the verifier refused the relay.
            AgentError: the node did not answer (in time, or with a quote
                by its AK over the nonce).
        """
        deadline = time.monotonic() + self.timeout
        await self._post(
            uuid, self._url(uuid, "identity"), IdentityAsk(request).to_dict(), deadline
        )
        url = f"{self._url(uuid, 'identity')}?nonce={request.nonce.hex()}"
        while True:
            data = await self._call("GET", url, None)
            try:
                relayed = IdentityRelayed.from_dict(data)
            except MalformedError as exc:
                raise ServiceError(f"the verifier's relay of node {uuid}: {exc}")
            if relayed.answer is not None:
                return relayed.answer
            if time.monotonic() > deadline:
                raise AgentError(
                    f"node {uuid}: no identity quote through the verifier's "
                    f"relay in {self.timeout:g} s (is its agent pushing?)"
                )
            await asyncio.sleep(_POLL)

    async def send_u(self, uuid: str, share: ShareU) -> bool:
        """Post U for the node and wait for the agent's outcome.

        Returns:
            True if U completed the node's bootstrap (V was there).

        Raises:
            ServiceError: the verifier refused it (e.g. posted already).
            AgentError: the agent refused U, or did not take it in time.
        """
        deadline = time.monotonic() + self.timeout
        await self._post(uuid, self._url(uuid, "u"), share.to_dict(), deadline)
        while True:
            data = await self._call("GET", self._url(uuid, "u"), None)
            try:
                status = URelayStatus.from_dict(data)
            except MalformedError as exc:
                raise ServiceError(f"the verifier's relay of node {uuid}: {exc}")
            if status.state == "accepted":
                return status.bootstrapped
            if status.state == "refused":
                raise AgentError(f"node {uuid}: the agent refused U: {status.detail}")
            if time.monotonic() > deadline:
                raise AgentError(
                    f"node {uuid}: U not taken through the verifier's relay in "
                    f"{self.timeout:g} s (state {status.state})"
                )
            await asyncio.sleep(_POLL)

    async def _post(
        self, uuid: str, url: str, body: Mapping[str, Any], deadline: float
    ) -> None:
        """POST to the relay. A node the verifier has not taken up yet
        (404 ``unknown_node`` right after ``trusted-nova boot`` enrolled
        it ahead) is asked again until ``deadline``.

        Raises:
            AgentError: the node's agent did not answer (502).
            ServiceError: any other refusal.
        """
        while True:
            try:
                await self._call("POST", url, body)
                return
            except ServiceError as exc:
                if exc.status == 502:
                    raise AgentError(f"node {uuid}: {exc}", exc.status, exc.code)
                pending = exc.status == 404 and exc.code == "unknown_node"
                if not pending or time.monotonic() > deadline:
                    raise
            await asyncio.sleep(_POLL)
