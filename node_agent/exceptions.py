"""Exceptions raised by the node agent.

All node agent errors derive from :class:`NodeAgentError` so callers can catch
the whole family at once. Exceptions only carry a message; logging is the
responsibility of whoever handles them. TPM failures are the shared TPM
module's :class:`verifier.common.errors.TpmError`, re-exported here.
"""

from verifier.common.errors import TpmError

__all__ = [
    "BootstrapError",
    "NodeAgentError",
    "RefusedError",
    "RegistrationError",
    "TpmError",
]


class NodeAgentError(Exception):
    """Base class of every error raised by the node agent."""


class RegistrationError(NodeAgentError):
    """Registration with the registrar, or AK activation, failed.

    Attributes:
        retryable: True if the registrar could not be reached or answered
            with a server error (it may not be up yet); False if it refused.
    """

    def __init__(self, message: str, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


class RefusedError(NodeAgentError):
    """The agent refuses a request from the verifier or the tenant (a share
    for the wrong node, a payload that does not decrypt, ...); the agent's
    server answers it with a 4xx JSON error body.

    Attributes:
        code: a stable machine-readable error code.
        detail: a human-readable message naming the problem.
        status: the HTTP status the server answers with.
    """

    def __init__(self, code: str, detail: str, status: int = 400) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail
        self.status = status


class BootstrapError(NodeAgentError):
    """The node's bootstrap configuration (bootstrap file, cloud-init's
    instance id or user-data) is missing where needed, unreadable or
    malformed."""
