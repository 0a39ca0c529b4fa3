"""Exceptions raised by the node agent.

All node agent errors derive from :class:`NodeAgentError` so callers can catch
the whole family at once. Exceptions only carry a message; logging is the
responsibility of whoever handles them.
"""


class NodeAgentError(Exception):
    """Base class of every error raised by the node agent."""


class TpmError(NodeAgentError):
    """A TPM (or TPM emulator) operation failed.

    The message names the failed operation and the underlying cause.
    """


class RegistrationError(NodeAgentError):
    """Registration with the registrar, or AK activation, failed.

    Attributes:
        retryable: True if the registrar could not be reached or answered
            with a server error (it may not be up yet); False if it refused.
    """

    def __init__(self, message: str, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable
