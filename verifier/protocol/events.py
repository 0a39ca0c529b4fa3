"""Signed revocation events.

A :class:`RevocationEvent` says how the verifier's word on a node changed:
its ``type`` is ``node.revoked`` (final: evidence of compromise, a check
that failed, a revocation on request, or silence past the unreachable
timeout), ``node.failed`` (a round could not be completed: the verifier
cannot vouch for the node), ``node.unreachable`` (it stopped answering:
not trusted, and nothing is known against it), ``node.recovered`` (a
failed or unreachable node passed a quote again: trusted as before) or
``node.host_untrusted`` (final, like revoked: the compute host running
the node was found untrusted, so the node is treated as compromised),
``node.policy_changed`` (the runtime or measured-boot policy in force on
the node changed: its ``reason`` is ``set`` by its tenant or ``follow``
of a new version of the name the node follows; its ``detail`` is the
:class:`PolicyChange` as canonical JSON). Its
canonical form is UTF-8 JSON with sorted keys and no whitespace; the
verifier signs those bytes with Ed25519. A :class:`SignedEvent` carries the
event, the signature and the signing key's id (SHA-256 of the raw public
key, hex), so consumers can pick the right key and verify before acting.

Wire form: ``{"event": {...}, "signature": "<b64>", "key_id": "<hex>"}``.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from verifier.protocol.envelope import canonical_uuid
from verifier.protocol.errors import EvidenceError, MalformedError

__all__ = [
    "EVENT_TYPES",
    "EVENT_VERSION",
    "NODE_FAILED",
    "NODE_HOST_UNTRUSTED",
    "NODE_POLICY_CHANGED",
    "NODE_RECOVERED",
    "NODE_REVOKED",
    "NODE_UNREACHABLE",
    "REVOKING_TYPES",
    "PolicyChange",
    "RevocationEvent",
    "SignedEvent",
    "key_id",
]

EVENT_VERSION = 1
#: The node failed a check or was revoked on request (final).
NODE_REVOKED = "node.revoked"
#: A round of the node could not be completed (an internal error).
NODE_FAILED = "node.failed"
#: The node stopped answering (not revoked: nothing is known against it).
NODE_UNREACHABLE = "node.unreachable"
#: A failed or unreachable node passed a quote again.
NODE_RECOVERED = "node.recovered"
#: The policy in force on the node changed (takes nothing away).
NODE_POLICY_CHANGED = "node.policy_changed"
#: The compute host running the node was found untrusted (final, like
#: revoked: a compromised host could read the guest's vTPM and memory).
NODE_HOST_UNTRUSTED = "node.host_untrusted"
EVENT_TYPES = frozenset(
    {
        NODE_REVOKED,
        NODE_FAILED,
        NODE_UNREACHABLE,
        NODE_RECOVERED,
        NODE_POLICY_CHANGED,
        NODE_HOST_UNTRUSTED,
    }
)
#: The events after which what a node held is no longer vouched for: the
#: key service bumps the node's epoch (and rekeys its groups) on these,
#: and a capability's epoch counts them.
REVOKING_TYPES = frozenset(
    {NODE_REVOKED, NODE_FAILED, NODE_UNREACHABLE, NODE_HOST_UNTRUSTED}
)
_FIELDS = ("version", "id", "node_uuid", "reason", "detail", "created_at", "type")


#: The policy kinds a :class:`PolicyChange` names.
POLICY_KINDS = ("runtime", "measured-boot")
_REF_FIELDS = ("name", "version", "digest")


def _policy_ref(data: object) -> dict[str, Any] | None:
    if data is None:
        return None
    if (
        not isinstance(data, Mapping)
        or set(data) != set(_REF_FIELDS)
        or not isinstance(data["name"], str)
        or not isinstance(data["digest"], str)
        or isinstance(data["version"], bool)
        or not isinstance(data["version"], int)
    ):
        raise MalformedError(
            "policy change", "from/to must be null or {name, version, digest}"
        )
    return {f: data[f] for f in _REF_FIELDS}


@dataclasses.dataclass(frozen=True)
class PolicyChange:
    """What a ``node.policy_changed`` event's ``detail`` says: the
    ``kind`` of policy, the one in force before (``old``) and after
    (``new``), each ``{"name", "version", "digest"}`` or None (no policy
    of that kind).

    Raises:
        MalformedError: an unknown kind or a bad policy reference.
    """

    kind: str
    old: Mapping[str, Any] | None
    new: Mapping[str, Any] | None

    def __post_init__(self) -> None:
        if self.kind not in POLICY_KINDS:
            raise MalformedError("policy change", f"unknown kind {self.kind[:64]!r}")
        object.__setattr__(self, "old", _policy_ref(self.old))
        object.__setattr__(self, "new", _policy_ref(self.new))

    def to_detail(self) -> str:
        """The canonical JSON the event's ``detail`` carries."""
        body = {"kind": self.kind, "from": self.old, "to": self.new}
        return json.dumps(body, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_detail(cls, detail: str) -> PolicyChange:
        """Parse an event's ``detail``.

        Raises:
            MalformedError: not the JSON of a policy change.
        """
        try:
            data = json.loads(detail)
        except (ValueError, RecursionError):
            raise MalformedError("policy change", "detail is not JSON") from None
        if not isinstance(data, dict) or set(data) != {"kind", "from", "to"}:
            raise MalformedError("policy change", "fields must be kind, from, to")
        kind = data["kind"]
        if not isinstance(kind, str):
            raise MalformedError("policy change", "kind must be a string")
        return cls(kind, data["from"], data["to"])


def key_id(public_key: ed25519.Ed25519PublicKey) -> str:
    """Hex SHA-256 of the raw Ed25519 public key."""
    raw = public_key.public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    return hashlib.sha256(raw).hexdigest()


@dataclasses.dataclass(frozen=True)
class RevocationEvent:
    """A node is revoked, or failed (see the module docstring).

    Attributes:
        id: unique event id (UUID string); consumers deduplicate on it.
        node_uuid: the revoked node.
        reason: machine-readable code (e.g. ``pcr_policy``).
        detail: human-readable explanation.
        created_at: ISO 8601 UTC timestamp given by the caller.
        type: one of :data:`EVENT_TYPES`.
    """

    id: str
    node_uuid: str
    reason: str
    detail: str
    created_at: str
    type: str = NODE_REVOKED
    version: int = EVENT_VERSION

    def __post_init__(self) -> None:
        canonical_uuid(self.id)
        canonical_uuid(self.node_uuid)
        if self.version != EVENT_VERSION:
            raise MalformedError("revocation event", f"unknown version {self.version}")
        if self.type not in EVENT_TYPES:
            raise MalformedError("revocation event", f"unknown type {self.type[:64]!r}")

    def canonical_bytes(self) -> bytes:
        return json.dumps(
            dataclasses.asdict(self), sort_keys=True, separators=(",", ":")
        ).encode()

    @classmethod
    def from_dict(cls, data: object) -> RevocationEvent:
        if not isinstance(data, Mapping) or set(data) != set(_FIELDS):
            raise MalformedError(
                "revocation event", f"fields must be {sorted(_FIELDS)}"
            )
        if not all(isinstance(data[f], str) for f in _FIELDS if f != "version"):
            raise MalformedError("revocation event", "fields must be strings")
        return cls(**{f: data[f] for f in _FIELDS})

    def sign(self, private_key: ed25519.Ed25519PrivateKey) -> SignedEvent:
        signature = private_key.sign(self.canonical_bytes())
        return SignedEvent(self, signature, key_id(private_key.public_key()))


@dataclasses.dataclass(frozen=True)
class SignedEvent:
    """An event with its Ed25519 signature."""

    event: RevocationEvent
    signature: bytes
    key_id: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "event": dataclasses.asdict(self.event),
            "signature": base64.b64encode(self.signature).decode(),
            "key_id": self.key_id,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: object) -> SignedEvent:
        """Parse the wire form (does not verify: call :meth:`verify`).

        Raises:
            MalformedError: naming the bad field.
        """
        if not isinstance(data, Mapping):
            raise MalformedError("signed event", "must be an object")
        text = data.get("signature")
        if not isinstance(text, str):
            raise MalformedError("signed event", "signature must be a base64 string")
        try:
            signature = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise MalformedError("signed event", "signature is not base64")
        kid = data.get("key_id")
        if not isinstance(kid, str):
            raise MalformedError("signed event", "key_id must be a string")
        return cls(RevocationEvent.from_dict(data.get("event")), signature, kid)

    def verify(self, public_key: ed25519.Ed25519PublicKey) -> RevocationEvent:
        """Return the event if it is signed by ``public_key``.

        Raises:
            EvidenceError: ``event_signature`` if it is not.
        """
        if self.key_id != key_id(public_key):
            raise EvidenceError("event_signature", "event signed by an unknown key")
        try:
            public_key.verify(self.signature, self.event.canonical_bytes())
        except InvalidSignature:
            raise EvidenceError("event_signature", "event signature does not verify")
        return self.event
