"""Capability requests (Snapdragon-style revocable capabilities): an
attested node, or its tenant, asks the verifier for a capability on one
object; the key service checks it (:mod:`verifier.protocol.capability`).

``POST /v1/nodes/{uuid}/capabilities``  :class:`CapabilityRequest` ->
                                        :class:`CapabilityGrant`
"""

from __future__ import annotations

import dataclasses
from typing import Any

from verifier.protocol.messages._fields import Reader, check_int, check_str

__all__ = ["CapabilityGrant", "CapabilityRequest"]

_MAX_OBJECT = 512
_MAX_RIGHTS = 8
#: A token is at most this long (see ``Capability.from_token``).
_MAX_TOKEN = 2048
_MAX_U64 = (1 << 64) - 1


@dataclasses.dataclass(frozen=True)
class CapabilityRequest:
    """Ask for ``rights`` on an object (``obj``; ``object`` on the wire).

    The object's syntax and the rights' letters are judged where the
    capability is made (:class:`~verifier.protocol.capability.Capability`).

    Raises:
        FieldError: not non-empty strings of bounded length.
    """

    obj: str
    rights: str

    _NAME = "capability request"

    def __post_init__(self) -> None:
        check_str(self._NAME, "object", self.obj, _MAX_OBJECT)
        check_str(self._NAME, "rights", self.rights, _MAX_RIGHTS)

    def to_dict(self) -> dict[str, Any]:
        return {"object": self.obj, "rights": self.rights}

    @classmethod
    def from_dict(cls, data: object) -> CapabilityRequest:
        """Parse a request body (unknown fields are refused).

        Raises:
            MalformedError: naming the field.
        """
        r = Reader(data, cls._NAME)
        msg = cls(r.get("object"), r.get("rights"))
        r.finish()
        return msg


@dataclasses.dataclass(frozen=True)
class CapabilityGrant:
    """A capability issued: the token to present, its expiry (seconds since
    the epoch) and the node's revocation epoch it was issued under.

    Raises:
        FieldError: a token that is not a bounded string, or an expiry or
            epoch that is not a non-negative integer.
    """

    token: str
    expiry: int
    epoch: int

    _NAME = "capability grant"

    def __post_init__(self) -> None:
        check_str(self._NAME, "token", self.token, _MAX_TOKEN)
        check_int(self._NAME, "expiry", self.expiry, 0, _MAX_U64)
        check_int(self._NAME, "epoch", self.epoch, 0, _MAX_U64)

    def to_dict(self) -> dict[str, Any]:
        return {"token": self.token, "expiry": self.expiry, "epoch": self.epoch}

    @classmethod
    def from_dict(cls, data: object) -> CapabilityGrant:
        """Parse the verifier's answer (unknown fields are ignored).

        Raises:
            MalformedError: naming the field.
        """
        r = Reader(data, cls._NAME)
        return cls(r.get("token"), r.get("expiry"), r.get("epoch"))
