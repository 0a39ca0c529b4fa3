"""Continuous attestation: the verifier's node registry and quote loop."""

from verifier.attest.clients import RegistrarClient, VerifierAgentClient
from verifier.attest.service import NodeState, NodeView, Verifier
from verifier.attest.settings import VerifierSettings

__all__ = [
    "NodeState",
    "NodeView",
    "RegistrarClient",
    "Verifier",
    "VerifierAgentClient",
    "VerifierSettings",
]
