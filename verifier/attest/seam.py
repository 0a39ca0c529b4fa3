"""What the push and relay paths need of the verifier service, as a
protocol: they depend on this seam, not on :mod:`verifier.attest.service`
(which builds them), so the service's modules form no import circle.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from verifier.attest.node import LiveNode
from verifier.attest.transitions import TransitionWriter
from verifier.protocol.attestation import AttestationRules, Verdict
from verifier.protocol.messages.shares import ShareV

if TYPE_CHECKING:  # CP-ABE is the abe extra
    from verifier.attest.abe_keys import AbeAuthority

__all__ = ["AttestingService"]


class AttestingService(Protocol):
    """The verifier service as push attestation and the tenant relay see
    it (:class:`verifier.attest.service.Verifier` is one)."""

    transitions: TransitionWriter
    rules: AttestationRules
    abe: AbeAuthority | None

    def live(self, uuid: str) -> LiveNode:
        """The node this process attests (NotFoundError: none)."""

    def relay_node(self, uuid: str) -> LiveNode:
        """The node for the tenant relay: the live one, or a polled node
        another process attests (NotFoundError: neither)."""

    def unreachable(self, node: LiveNode, detail: str) -> None:
        """Count one round without an answer (and act on it)."""

    def share_v(self, node: LiveNode, verdict: Verdict) -> ShareV | None:
        """V, the identity certificate and the U commitment for the node."""

    async def call_agent(
        self,
        node: LiveNode,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
    ) -> Mapping[str, Any]:
        """One request to a polled node's agent on the verifier's own mTLS
        connection (its certificate pinned from the registrar).

        Raises:
            AgentUnreachableError: transport failure or a non-2xx answer.
            MalformedError: a 2xx answer that is not a JSON object.
        """
