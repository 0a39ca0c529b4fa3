"""Errors of the shared plumbing (:mod:`verifier.common`): one root, split
by who is at fault: the caller of a server (:class:`RequestError`), the
network or the peer of a client (:class:`TransportError`), a TPM
(:class:`TpmError`). Each service maps these to its own errors; a server
answers a :class:`RequestError` with its JSON error body."""

from __future__ import annotations

__all__ = [
    "AgentUnreachableError",
    "CommonError",
    "ConflictError",
    "NotFoundError",
    "RequestError",
    "TctiConfigError",
    "TpmError",
    "TransportError",
    "unknown_node",
]


class CommonError(Exception):
    """Root of the shared plumbing's errors."""


class RequestError(CommonError):
    """A client sent a request we refuse (maps to HTTP 4xx).

    Attributes:
        status: the HTTP status to answer with.
        code: a stable machine-readable error code.
        detail: a human-readable message naming the problem.
    """

    status = 400

    def __init__(self, code: str, detail: str, status: int | None = None) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail
        if status is not None:
            self.status = status


class NotFoundError(RequestError):
    status = 404


def unknown_node(uuid: str) -> NotFoundError:
    """The one answer for a node the caller may not know about: not
    enrolled, or another project's (the same bytes, so that a project
    cannot probe which UUIDs exist; give the UUID in its canonical form).
    """
    return NotFoundError("unknown_node", f"node {uuid} is not enrolled")


class ConflictError(RequestError):
    status = 409


class TransportError(CommonError):
    """An HTTP exchange failed before a usable answer: connection refused,
    TLS failure (including a peer certificate that is not the pinned one),
    timeout, or an answer that is not HTTP."""


class AgentUnreachableError(TransportError):
    """A node agent did not take a request: transport failure, a
    certificate that is not the pinned one, or a non-2xx answer (bad
    evidence in a 2xx answer is the protocol core's ``MalformedError``)."""


class TpmError(CommonError):
    """A TPM (or TPM emulator) operation failed.

    The message names the failed operation and the underlying cause.
    """


class TctiConfigError(TpmError):
    """The TCTI string names no loadable TCTI module or a configuration
    that module rejects (``swtmp:...``, ``swtpm:prt=2321``): no retry can
    help, unlike a TPM that does not answer yet."""
