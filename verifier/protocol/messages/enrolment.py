"""Enrolment: the tenant hands the verifier share V and what to check
(ARCHITECTURE "Flows" 1 and 3), and may later revoke the node.

``POST /v1/nodes``                :class:`EnrolmentRequest`
``POST /v1/nodes/batch``          :class:`EnrolmentBatch` (up to
                                  :data:`MAX_BATCH` enrolments)
``POST /v1/nodes/{uuid}/revoke``  :class:`RevokeRequest` (body optional)
``PUT /v1/nodes/{uuid}/policy``   :class:`PolicyChangeRequest`

Both are requests: fields they do not define are refused, so a misspelt
``runtime_policy`` is an error, not an enrolment without a runtime policy.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping
from typing import Any

from verifier.protocol.enroller import COMMITMENT_BYTES
from verifier.protocol.errors import FieldError, MalformedError
from verifier.protocol.messages._fields import (
    Reader,
    b64,
    canonical_uuid_field,
    check_bool,
    check_bytes,
    check_str,
)
from verifier.protocol.policy import PcrPolicy
from verifier.protocol.shares import KEY_BYTES

__all__ = [
    "MAX_BATCH",
    "MAX_DETAIL",
    "MAX_INTERVAL",
    "MIN_INTERVAL",
    "MAX_POLICY_REF",
    "MODES",
    "AttestationMode",
    "EnrolmentBatch",
    "EnrolmentRequest",
    "PolicyChangeRequest",
    "RevokeRequest",
    "check_interval",
]


class AttestationMode(enum.StrEnum):
    """How a node's evidence reaches the verifier, as enrolled (stored as
    the value; the node's state machine,
    :mod:`verifier.protocol.attestation`, re-exports it beside
    ``NodeState``)."""

    #: the verifier polls the node's agent for quotes
    PULL = "pull"
    #: the node's agent posts evidence to challenges
    #: (:mod:`verifier.protocol.push`)
    PUSH = "push"


#: The longest stored-policy reference (``name``, ``name@version``, digest).
MAX_POLICY_REF = 299
#: How a node is attested: ``pull`` (the verifier polls its agent) or
#: ``push`` (its agent posts evidence, :mod:`verifier.protocol.push`).
MODES = tuple(mode.value for mode in AttestationMode)
#: The longest revocation detail a tenant may give.
MAX_DETAIL = 1000
#: The bounds of a node's own quote interval, in seconds (a verifier may
#: hold its tenants to a longer shortest one: ``min_node_interval``).
MIN_INTERVAL = 0.1
MAX_INTERVAL = 86400.0


def check_interval(structure: str, value: object) -> float | None:
    """A node's quote interval as a float, or None.

    Raises:
        FieldError: not a finite number of seconds in
            :data:`MIN_INTERVAL`..:data:`MAX_INTERVAL`.
    """
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not MIN_INTERVAL <= value <= MAX_INTERVAL
    ):
        raise FieldError(
            structure,
            "interval",
            f"must be a number of seconds {MIN_INTERVAL:g}..{MAX_INTERVAL:g}",
        )
    return float(value)


@dataclasses.dataclass(frozen=True)
class EnrolmentRequest:
    """Enrol a node: V, the PCR policy, references to stored policies.

    Attributes:
        uuid: the node (canonical form).
        v: the tenant's share V (:data:`~verifier.protocol.shares.KEY_BYTES`).
        policy: allowed PCR values; may be empty when a runtime or
            measured-boot policy is named.
        runtime_policy: a stored IMA runtime policy reference, or None.
        mb_policy: a stored measured-boot policy reference, or None.
        await_instance: enrol ahead of the instance (Nova is creating it).
        mode: :class:`AttestationMode` ``pull`` (default) or ``push``
            (given as the enum or its value).
        u_commitment: the enroller's commitment to its share U
            (:func:`verifier.protocol.enroller.commit_u`); the node takes U
            only if it matches. Required: an enrolment without it is
            refused.
        interval: the node's own seconds between quotes, its verification
            class (None: the verifier's ``quote_interval``): how often a
            pull node is polled, or how often a push node's agent is told
            to post its evidence.

    Raises:
        FieldError: a field of the wrong type or size.
        MalformedError: ``uuid`` is not a UUID, or the policy does not parse
            (an empty one without a runtime or measured-boot policy).
    """

    uuid: str
    v: bytes
    policy: PcrPolicy
    runtime_policy: str | None = None
    mb_policy: str | None = None
    await_instance: bool = False
    mode: AttestationMode = AttestationMode.PULL
    u_commitment: bytes = b""
    interval: float | None = None

    _NAME = "enrolment request"

    def __post_init__(self) -> None:
        canonical = canonical_uuid_field(self._NAME, "uuid", self.uuid)
        object.__setattr__(self, "uuid", canonical)
        check_bytes(self._NAME, "v", self.v, KEY_BYTES, exact=KEY_BYTES)
        if not isinstance(self.policy, PcrPolicy):
            raise FieldError(self._NAME, "policy", "must be a PCR policy")
        for name in ("runtime_policy", "mb_policy"):
            check_str(
                self._NAME, name, getattr(self, name), MAX_POLICY_REF, optional=True
            )
        check_bool(self._NAME, "await_instance", self.await_instance)
        if self.mode not in MODES:
            raise FieldError(self._NAME, "mode", "must be 'pull' or 'push'")
        object.__setattr__(self, "mode", AttestationMode(self.mode))
        check_bytes(
            self._NAME,
            "u_commitment",
            self.u_commitment,
            COMMITMENT_BYTES,
            exact=COMMITMENT_BYTES,
        )
        object.__setattr__(self, "interval", check_interval(self._NAME, self.interval))

    @property
    def has_policy_refs(self) -> bool:
        """True when a runtime or measured-boot policy is named."""
        return self.runtime_policy is not None or self.mb_policy is not None

    def to_dict(self) -> dict[str, Any]:
        """The JSON body (``interval`` only when set: verifiers from
        before verification classes refuse the field)."""
        body: dict[str, Any] = {
            "uuid": self.uuid,
            "v": b64(self.v),
            "policy": self.policy.to_dict(),
            "runtime_policy": self.runtime_policy,
            "mb_policy": self.mb_policy,
            "await_instance": self.await_instance,
            "mode": self.mode.value,
            "u_commitment": b64(self.u_commitment),
        }
        if self.interval is not None:
            body["interval"] = self.interval
        return body

    @classmethod
    def from_dict(cls, data: object) -> EnrolmentRequest:
        """Parse a request body (unknown fields are refused).

        A missing or null ``policy`` is the empty policy when a runtime or
        measured-boot policy is named.

        Raises:
            MalformedError: as the constructor, or ``v`` is not base64.
        """
        r = Reader(data, cls._NAME)
        uuid = r.get("uuid")
        v = r.b64("v", KEY_BYTES)
        refs = r.get("runtime_policy"), r.get("mb_policy")
        document = r.get("policy")
        with_refs = any(ref is not None for ref in refs)
        if document is None and with_refs:
            policy = PcrPolicy({})
        else:
            policy = PcrPolicy.from_dict(document, allow_empty=with_refs)
        await_instance = r.get("await_instance")
        mode = r.get("mode")
        commitment = r.b64("u_commitment", COMMITMENT_BYTES)
        interval = r.get("interval")
        r.finish()
        return cls(
            uuid,
            v,
            policy,
            refs[0],
            refs[1],
            False if await_instance is None else await_instance,
            AttestationMode.PULL if mode is None else mode,
            commitment,
            interval,
        )


@dataclasses.dataclass(frozen=True)
class RevokeRequest:
    """The tenant revokes a node.

    Attributes:
        detail: why (recorded in the signed revocation event).

    Raises:
        FieldError: ``detail`` is not a string of at most
            :data:`MAX_DETAIL` characters.
    """

    detail: str = "revoked by the tenant"

    _NAME = "revoke request"

    def __post_init__(self) -> None:
        check_str(self._NAME, "detail", self.detail, MAX_DETAIL, min_len=0)

    def to_dict(self) -> dict[str, Any]:
        return {"detail": self.detail}

    @classmethod
    def from_dict(cls, data: object) -> RevokeRequest:
        """Parse a request body (unknown fields are refused; an empty
        object keeps the default detail).

        Raises:
            MalformedError: naming the field.
        """
        r = Reader(data, cls._NAME)
        detail = r.get("detail")
        r.finish()
        return cls() if detail is None else cls(detail)


#: The fields of a :class:`PolicyChangeRequest` and the policy kind of each.
_CHANGE_FIELDS = {"runtime_policy": "runtime", "mb_policy": "measured-boot"}


@dataclasses.dataclass(frozen=True)
class PolicyChangeRequest:
    """The tenant changes the policies in force on an enrolled node.

    Attributes:
        changes: the fields given, ``runtime_policy`` and/or ``mb_policy``,
            each a stored-policy reference (a bare ``name`` follows it,
            ``name@version`` or a digest pins one) or None (no policy of
            that kind from now on). A field not given is unchanged.

    Raises:
        FieldError: no field given, or a reference that is neither a
            string of at most :data:`MAX_POLICY_REF` characters nor null.
    """

    changes: Mapping[str, str | None]

    _NAME = "policy change request"

    def __post_init__(self) -> None:
        if not self.changes:
            raise FieldError(
                self._NAME, "runtime_policy", "or 'mb_policy' must be given"
            )
        for name, ref in self.changes.items():
            if name not in _CHANGE_FIELDS:
                raise FieldError(self._NAME, name, "is not a policy field")
            check_str(self._NAME, name, ref, MAX_POLICY_REF, optional=True)
        object.__setattr__(self, "changes", dict(self.changes))

    def refs(self) -> dict[str, str | None]:
        """Policy kind (``runtime``, ``measured-boot``) -> reference or None,
        for the kinds the request changes."""
        return {_CHANGE_FIELDS[name]: ref for name, ref in self.changes.items()}

    def to_dict(self) -> dict[str, Any]:
        return dict(self.changes)

    @classmethod
    def from_dict(cls, data: object) -> PolicyChangeRequest:
        """Parse a request body (unknown fields are refused; a field given
        as null drops that kind of policy, an absent one keeps it).

        Raises:
            MalformedError: naming the field.
        """
        r = Reader(data, cls._NAME)
        assert isinstance(data, Mapping)  # or Reader raised
        present = {name: r.get(name) for name in _CHANGE_FIELDS if name in data}
        r.finish()
        return cls(present)


#: The most enrolments one batch request holds.
MAX_BATCH = 1000


@dataclasses.dataclass(frozen=True)
class EnrolmentBatch:
    """Many enrolments in one request (a boot storm; keylime's users ask
    for bulk adds, keylime issue #1415): ``{"nodes": [enrolment, ...]}``.

    Raises:
        FieldError: ``nodes`` is not a list of 1 to :data:`MAX_BATCH`
            enrolments.
        MalformedError: an enrolment as :class:`EnrolmentRequest` refuses
            it, named by its index (``nodes.3: ...``).
    """

    nodes: tuple[EnrolmentRequest, ...]

    _NAME = "enrolment batch"

    def __post_init__(self) -> None:
        if not 1 <= len(self.nodes) <= MAX_BATCH:
            raise FieldError(
                self._NAME, "nodes", f"must be a list of 1 to {MAX_BATCH} enrolments"
            )

    def to_dict(self) -> dict[str, Any]:
        return {"nodes": [n.to_dict() for n in self.nodes]}

    @classmethod
    def from_dict(cls, data: object) -> EnrolmentBatch:
        """Parse a request body (unknown fields are refused).

        Raises:
            MalformedError: as the constructor.
        """
        r = Reader(data, cls._NAME)
        items = r.get("nodes")
        r.finish()
        if not isinstance(items, list) or not 1 <= len(items) <= MAX_BATCH:
            raise FieldError(
                cls._NAME, "nodes", f"must be a list of 1 to {MAX_BATCH} enrolments"
            )
        nodes = []
        for i, item in enumerate(items):
            try:
                nodes.append(EnrolmentRequest.from_dict(item))
            except MalformedError as exc:
                raise MalformedError(cls._NAME, f"nodes.{i}: {exc}") from None
        return cls(tuple(nodes))
