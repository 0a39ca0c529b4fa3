"""The share envelopes a node agent receives (ARCHITECTURE "Flows" 3): the
tenant's U (with the sealed payload unless the node has it from its
user-data), the verifier's V with the node's
identity certificate. Both shares are sealed to the node's quoted transport
key NK (:func:`verifier.protocol.envelope.seal_share`); this layer checks
their form, the agent opens them.

``POST /v1/keys/u``  :class:`ShareU` -> :class:`ShareAccepted`
``POST /v1/keys/v``  :class:`ShareV` -> :class:`ShareAccepted`
"""

from __future__ import annotations

import dataclasses
from typing import Any

from verifier.protocol.enroller import COMMITMENT_BYTES
from verifier.protocol.envelope import MAX_PAYLOAD_BYTES
from verifier.protocol.errors import FieldError
from verifier.protocol.messages._fields import (
    Reader,
    b64,
    canonical_uuid_field,
    check_bool,
    check_bytes,
    check_pem_certificate,
)

__all__ = [
    "MAX_PAYLOAD_ENVELOPE",
    "MAX_SHARE_ENVELOPE",
    "ShareAccepted",
    "ShareU",
    "ShareV",
]

#: A share envelope is 96 bytes for a 32-byte share; leave room.
MAX_SHARE_ENVELOPE = 1024
#: A payload envelope is the payload plus 32 bytes (magic, nonce, tag).
MAX_PAYLOAD_ENVELOPE = MAX_PAYLOAD_BYTES + 64


@dataclasses.dataclass(frozen=True)
class ShareU:
    """The tenant's share U and the payload envelope.

    Attributes:
        u: U sealed to the node's NK.
        payload: the payload sealed under K; None when the node has it
            already (the user-data of ``trusted-nova boot``, which also
            names the UUID it is bound to).
        payload_id: the UUID the payload envelope is bound to when it is not
            the node's own (a payload sealed before Nova named the
            instance), canonical form; None for the node's own. Only with
            ``payload``.

    Raises:
        FieldError: a field of the wrong type or size, or ``payload_id``
            without ``payload``.
        MalformedError: ``payload_id`` is not a UUID.
    """

    u: bytes
    payload: bytes | None = None
    payload_id: str | None = None

    _NAME = "share U"

    def __post_init__(self) -> None:
        check_bytes(self._NAME, "u", self.u, MAX_SHARE_ENVELOPE)
        check_bytes(
            self._NAME, "payload", self.payload, MAX_PAYLOAD_ENVELOPE, optional=True
        )
        canonical = canonical_uuid_field(
            self._NAME, "payload_id", self.payload_id, optional=True
        )
        if canonical is not None and self.payload is None:
            raise FieldError(self._NAME, "payload_id", "is only allowed with payload")
        object.__setattr__(self, "payload_id", canonical)

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"u": b64(self.u)}
        if self.payload is not None:
            body["payload"] = b64(self.payload)
        if self.payload_id is not None:
            body["payload_id"] = self.payload_id
        return body

    @classmethod
    def from_dict(cls, data: object) -> ShareU:
        """Parse a request body (unknown fields are refused).

        Raises:
            MalformedError: as the constructor, or a field that is not base64.
        """
        r = Reader(data, cls._NAME)
        msg = cls(
            r.b64("u", MAX_SHARE_ENVELOPE),
            r.optional_b64("payload", MAX_PAYLOAD_ENVELOPE),
            r.get("payload_id"),
        )
        r.finish()
        return msg


@dataclasses.dataclass(frozen=True)
class ShareV:
    """The verifier's share V and, when it runs a CA, the node's identity
    certificate.

    Attributes:
        v: V sealed to the node's NK.
        identity_cert: one PEM certificate (the agent checks that it is
            for its identity key), or None.
        u_commitment: the enroller's commitment to U
            (:mod:`verifier.protocol.enroller`): the node combines V only
            with the U that matches it. None for an enrolment made before
            commitments existed (the node then takes U only from a tenant
            certificate, as before).

    Raises:
        FieldError: a field of the wrong type or size.
        MalformedError: ``identity_cert`` is not exactly one PEM certificate.
    """

    v: bytes
    identity_cert: str | None = None
    u_commitment: bytes | None = None

    _NAME = "share V"

    def __post_init__(self) -> None:
        check_bytes(self._NAME, "v", self.v, MAX_SHARE_ENVELOPE)
        if self.identity_cert is not None:
            check_pem_certificate(self._NAME, "identity_cert", self.identity_cert)
        check_bytes(
            self._NAME,
            "u_commitment",
            self.u_commitment,
            COMMITMENT_BYTES,
            exact=COMMITMENT_BYTES,
            optional=True,
        )

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"v": b64(self.v), "identity_cert": self.identity_cert}
        if self.u_commitment is not None:
            body["u_commitment"] = b64(self.u_commitment)
        return body

    @classmethod
    def from_dict(cls, data: object) -> ShareV:
        """Parse a request body (unknown fields are refused).

        Raises:
            MalformedError: as the constructor, or ``v`` is not base64.
        """
        r = Reader(data, cls._NAME)
        msg = cls(
            r.b64("v", MAX_SHARE_ENVELOPE),
            r.get("identity_cert"),
            r.optional_b64("u_commitment", COMMITMENT_BYTES),
        )
        r.finish()
        return msg


@dataclasses.dataclass(frozen=True)
class ShareAccepted:
    """The agent took a share; ``bootstrapped`` when it completed K.

    Raises:
        FieldError: ``accepted`` is not ``"u"`` or ``"v"``, or
            ``bootstrapped`` is not a boolean.
    """

    accepted: str
    bootstrapped: bool

    _NAME = "share accepted"

    def __post_init__(self) -> None:
        if self.accepted not in ("u", "v"):
            raise FieldError(self._NAME, "accepted", "must be 'u' or 'v'")
        check_bool(self._NAME, "bootstrapped", self.bootstrapped)

    def to_dict(self) -> dict[str, Any]:
        return {"accepted": self.accepted, "bootstrapped": self.bootstrapped}

    @classmethod
    def from_dict(cls, data: object) -> ShareAccepted:
        """Parse the agent's answer (unknown fields are ignored).

        Raises:
            MalformedError: naming the field.
        """
        r = Reader(data, cls._NAME)
        return cls(r.get("accepted"), r.get("bootstrapped"))
