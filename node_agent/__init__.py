"""The trusted-cloud node agent: TPM identity, quotes, payload bootstrap."""

from node_agent.agent import Agent
from node_agent.exceptions import NodeAgentError, RegistrationError, TpmError

__all__ = ["Agent", "NodeAgentError", "RegistrationError", "TpmError"]
