"""The trusted-cloud node agent: TPM identity, quotes, payload bootstrap.

:class:`Agent` needs the TPM stack (tpm2-pytss, the ``agent`` extra) and is
imported on first use: the package's options (``node_agent.conf``, the
``node_agent`` namespace of oslo-config-generator and of the configuration
check every command runs) load without it, in any role.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from node_agent.exceptions import NodeAgentError, RegistrationError, TpmError

if TYPE_CHECKING:
    from node_agent.agent import Agent

__all__ = ["Agent", "NodeAgentError", "RegistrationError", "TpmError"]


def __getattr__(name: str) -> Any:
    if name == "Agent":
        from node_agent.agent import Agent

        return Agent
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
