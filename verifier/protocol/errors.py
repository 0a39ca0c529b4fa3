"""Exceptions of the protocol core.

One root, :class:`ProtocolError`, with sub-roots by who is at fault:

* :class:`MalformedError` -- bytes or fields that do not parse (the sender
  is broken or hostile); its :class:`FieldError` names a message field of
  the wrong JSON type, encoding or size;
* :class:`EvidenceError` -- well-formed evidence that fails a check (the
  node's state or identity is not what it claims);
* :class:`EnvelopeError` -- a ciphertext that does not authenticate.

Exceptions carry fields and never log.
"""

from __future__ import annotations

__all__ = [
    "EnvelopeError",
    "EvidenceError",
    "FieldError",
    "MalformedError",
    "ProtocolError",
]


class ProtocolError(Exception):
    """Root of every error raised by :mod:`verifier.protocol`."""


class MalformedError(ProtocolError):
    """Input that does not parse as the structure it claims to be.

    Attributes:
        structure: name of the structure being parsed (e.g. ``TPMS_ATTEST``).
        detail: what exactly is wrong.
        code: a stable machine-readable code for error bodies: ``malformed``
            (the value is not a valid instance of the structure it names).
    """

    code = "malformed"

    def __init__(self, structure: str, detail: str) -> None:
        super().__init__(f"malformed {structure}: {detail}")
        self.structure = structure
        self.detail = detail


class FieldError(MalformedError):
    """A field of a wire message that is missing, of the wrong JSON type,
    not in its encoding (base64, hex), out of its range or too large.

    Content that has the right form but is not a valid instance of what it
    names (a string that is not a UUID, bytes that are not a TPM2B_PUBLIC)
    is a plain :class:`MalformedError`.

    Attributes:
        field: the name of the offending field (dotted for nested ones).
        code: ``bad_field``.
    """

    code = "bad_field"

    def __init__(self, structure: str, field: str, detail: str) -> None:
        super().__init__(structure, f"'{field}' {detail}")
        self.field = field


class EvidenceError(ProtocolError):
    """Evidence that parses but fails verification.

    Attributes:
        reason: a stable, machine-readable code (e.g. ``nonce_mismatch``).
        detail: a human-readable explanation (never contains secrets).
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class EnvelopeError(ProtocolError):
    """An authenticated ciphertext that fails to open (wrong key, wrong
    associated data, or tampering)."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail
