"""Continuous attestation: the verifier's node registry and quote loop."""

from verifier.attest.clients import AgentClient, RegistrarClient
from verifier.attest.service import NodeState, NodeView, Verifier
from verifier.attest.settings import VerifierSettings

__all__ = [
    "AgentClient",
    "NodeState",
    "NodeView",
    "RegistrarClient",
    "Verifier",
    "VerifierSettings",
]
