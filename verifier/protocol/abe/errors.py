"""Exceptions of the CP-ABE (policy sealing) core.

All derive from :mod:`verifier.protocol.errors`, so callers that catch
:class:`~verifier.protocol.errors.ProtocolError` catch these too:

* :class:`PolicyError` -- a policy string or an attribute that does not
  parse (a :class:`~verifier.protocol.errors.MalformedError` with a
  ``position``);
* :class:`AbeError` -- well-formed input the scheme refuses: attributes
  that do not satisfy the policy, a key or ciphertext made under other
  public parameters;
* :class:`SealIntegrityError` -- a sealed blob whose AES-GCM tag does not
  verify (wrong key, other associated data, or tampering).
"""

from __future__ import annotations

from verifier.protocol.errors import EnvelopeError, MalformedError, ProtocolError

__all__ = ["AbeError", "PolicyError", "SealIntegrityError"]


class PolicyError(MalformedError):
    """A policy or attribute string that does not parse.

    Attributes:
        position: 0-based character offset of the problem in ``text``.
        text: the string being parsed.
        expected: what the parser expected at ``position``.
    """

    def __init__(self, structure: str, text: str, position: int, expected: str) -> None:
        super().__init__(
            structure, f"at position {position}: expected {expected} in {text!r}"
        )
        self.text = text
        self.position = position
        self.expected = expected


class AbeError(ProtocolError):
    """The scheme refuses well-formed input.

    Attributes:
        detail: a human-readable explanation (never contains secrets).
    """

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class SealIntegrityError(AbeError, EnvelopeError):
    """A sealed payload that does not authenticate."""
