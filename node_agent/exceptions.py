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
