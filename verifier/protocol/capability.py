"""Revocable capabilities (after Snapdragon, Aguilera et al., 2003).

The verifier gives an attested node a short-lived :class:`Capability`: a
keyed MAC (BLAKE2b-256, key shared by the verifier and the key service) over
the node, the object, the rights, the expiry, the node's epoch and a random
nonce. The key service checks it locally with a :class:`CapabilityChecker`
(no call to the verifier): MAC, expiry, rights, epoch, replay.

Revocation bumps the node's epoch at the key service with one message, so
every capability the node still holds dies at once. A capability whose
epoch is *newer* than the checker's proves the issuer has moved on (the MAC
is the issuer's), so the checker raises its floor to that epoch.

Each capability is single-use: the checker remembers the nonces it has
accepted until they expire, and a second presentation is a replay.

Wire form: a token ``base64url(body) "." base64url(mac)`` where ``body`` is
canonical JSON with sorted keys.
"""

from __future__ import annotations

import base64
import binascii
import collections
import dataclasses
import functools
import hashlib
import hmac
import json
import re
from collections.abc import Mapping

from verifier.protocol.envelope import canonical_uuid
from verifier.protocol.errors import EvidenceError, MalformedError

__all__ = [
    "CAPABILITY_KEY_BYTES",
    "RIGHTS",
    "Capability",
    "CapabilityChecker",
    "CapabilityError",
    "issue",
]

CAPABILITY_KEY_BYTES = 32
NONCE_BYTES = 16
MAC_BYTES = 32
RIGHTS = frozenset("rwj")  # read, write, join (a key group)
_OBJECT = re.compile(r"^[A-Za-z0-9._:/-]{1,200}$")
_PROJECT = re.compile(r"^[A-Za-z0-9._-]{0,255}$")
_PERSON = b"tc-cap-v1"


class CapabilityError(EvidenceError):
    """A capability that must not be honoured.

    ``reason`` is one of ``bad_mac``, ``expired``, ``old_epoch``, ``replay``,
    ``wrong_object``, ``no_right``, ``malformed``.
    """


@dataclasses.dataclass(frozen=True)
class Capability:
    """What a node may do to one object until ``expiry``.

    Attributes:
        node: the node's UUID.
        obj: what it is for (e.g. ``luks:vol-1``, ``group:web``).
        rights: a sorted string of letters from :data:`RIGHTS`.
        expiry: seconds since the epoch after which it is refused.
        epoch: the node's revocation epoch when it was issued.
        nonce: 16 random bytes (hex on the wire).
        mac: BLAKE2b-256 keyed MAC over the fields.
        project: the project that owns the node (the key service gives
            the node only that project's secrets); "" for a node of none.
    """

    node: str
    obj: str
    rights: str
    expiry: int
    epoch: int
    nonce: bytes
    mac: bytes = b""
    project: str = ""

    def __post_init__(self) -> None:
        canonical_uuid(self.node)
        if not isinstance(self.project, str) or not _PROJECT.match(self.project):
            raise MalformedError("capability", "project must match [A-Za-z0-9._-]*")
        if not isinstance(self.obj, str) or not _OBJECT.match(self.obj):
            raise MalformedError("capability", "object must match [A-Za-z0-9._:/-]+")
        if (
            not isinstance(self.rights, str)
            or not self.rights
            or not set(self.rights) <= RIGHTS
            or "".join(sorted(set(self.rights))) != self.rights
        ):
            raise MalformedError("capability", "rights must be sorted letters of rwj")
        for name in ("expiry", "epoch"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise MalformedError("capability", f"{name} must be an integer >= 0")
        if not isinstance(self.nonce, bytes) or len(self.nonce) != NONCE_BYTES:
            raise MalformedError("capability", f"nonce must be {NONCE_BYTES} bytes")
        if not isinstance(self.mac, bytes) or len(self.mac) not in (0, MAC_BYTES):
            raise MalformedError("capability", f"mac must be {MAC_BYTES} bytes")

    @functools.cached_property
    def body(self) -> bytes:
        """The canonical bytes the MAC covers."""
        fields = {
            "node": self.node,
            "object": self.obj,
            "rights": self.rights,
            "expiry": self.expiry,
            "epoch": self.epoch,
            "nonce": self.nonce.hex(),
            "project": self.project,
        }
        return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()

    def to_token(self) -> str:
        """The compact wire form (for an ``Authorization`` header)."""
        enc = base64.urlsafe_b64encode
        return f"{enc(self.body).decode()}.{enc(self.mac).decode()}"

    @classmethod
    def from_token(cls, token: object) -> Capability:
        """Parse a token (does not check it: see :class:`CapabilityChecker`).

        Raises:
            MalformedError: naming what is wrong.
        """
        if not isinstance(token, str) or token.count(".") != 1 or len(token) > 2048:
            raise MalformedError("capability", "token must be 'body.mac'")
        body_text, mac_text = token.split(".")
        try:
            body = base64.urlsafe_b64decode(body_text.encode())
            mac = base64.urlsafe_b64decode(mac_text.encode())
            data = json.loads(body)
        except (binascii.Error, ValueError, UnicodeDecodeError):
            raise MalformedError("capability", "token is not base64url JSON")
        cap = cls._from_fields(data, mac)
        if cap.body != body:
            raise MalformedError("capability", "body is not in canonical form")
        return cap

    @classmethod
    def _from_verified(cls, data: object, mac: bytes, body: bytes) -> Capability:
        """A capability from a body whose MAC verified: the issuer validated
        every field when it made it, so only the types are checked here (the
        full check costs ~5x the MAC)."""
        try:
            assert isinstance(data, dict)
            node, obj, rights = data["node"], data["object"], data["rights"]
            expiry, epoch = data["expiry"], data["epoch"]
            nonce = bytes.fromhex(data["nonce"])
            project = data["project"]
            assert isinstance(project, str)
            assert isinstance(node, str) and isinstance(obj, str)
            assert isinstance(rights, str)
            assert type(expiry) is int and type(epoch) is int
        except (AssertionError, KeyError, TypeError, ValueError):
            raise MalformedError("capability", "fields have the wrong types")
        cap = object.__new__(cls)
        for name, value in (
            ("node", node), ("obj", obj), ("rights", rights), ("expiry", expiry),
            ("epoch", epoch), ("nonce", nonce), ("mac", mac), ("project", project),
        ):  # fmt: skip
            object.__setattr__(cap, name, value)
        cap.__dict__["body"] = body  # exactly what the MAC covered
        return cap

    @classmethod
    def _from_fields(cls, data: object, mac: bytes) -> Capability:
        names = {"node", "object", "rights", "expiry", "epoch", "nonce", "project"}
        if not isinstance(data, Mapping) or set(data) != names:
            raise MalformedError("capability", f"fields must be {sorted(names)}")
        try:
            nonce = bytes.fromhex(data["nonce"])
        except (TypeError, ValueError):
            raise MalformedError("capability", "nonce must be hex")
        return cls(
            data["node"],
            data["object"],
            data["rights"],
            data["expiry"],
            data["epoch"],
            nonce,
            mac,
            data["project"],
        )


def _mac(key: bytes, body: bytes) -> bytes:
    return hashlib.blake2b(
        body, key=key, digest_size=MAC_BYTES, person=_PERSON
    ).digest()


def _check_key(key: bytes) -> bytes:
    if not isinstance(key, bytes) or len(key) != CAPABILITY_KEY_BYTES:
        raise ValueError(f"capability key must be {CAPABILITY_KEY_BYTES} bytes")
    return key


def issue(
    key: bytes,
    node: str,
    obj: str,
    rights: str,
    expiry: int,
    epoch: int,
    nonce: bytes,
    project: str = "",
) -> Capability:
    """A capability MAC'd under ``key`` (the caller supplies the nonce) for
    a node of ``project``.

    Raises:
        MalformedError: if a field is invalid.
    """
    unsigned = Capability(node, obj, rights, expiry, epoch, nonce, project=project)
    return dataclasses.replace(unsigned, mac=_mac(_check_key(key), unsigned.body))


class CapabilityChecker:
    """The key service's side: checks capabilities and holds node epochs.

    Args:
        key: the MAC key shared with the issuer.
        epochs: initial node -> epoch floors (e.g. restored from disk).

    Attributes:
        rejected: counts of refusals by reason.
        accepted: number of capabilities honoured.
    """

    def __init__(self, key: bytes, epochs: Mapping[str, int] | None = None) -> None:
        self._key = _check_key(key)
        self._epochs: dict[str, int] = dict(epochs or {})
        self._seen: dict[bytes, int] = {}  # nonce -> expiry
        self._next_prune = 0
        self.rejected: collections.Counter[str] = collections.Counter()
        self.accepted = 0

    def epoch(self, node: str) -> int:
        """The lowest epoch still honoured for ``node``."""
        return self._epochs.get(node, 0)

    def epochs(self) -> dict[str, int]:
        return dict(self._epochs)

    def bump(self, node: str) -> int:
        """Revoke every outstanding capability of ``node``; the new epoch."""
        new = self._epochs.get(node, 0) + 1
        self._epochs[node] = new
        return new

    def _refuse(self, reason: str, detail: str) -> CapabilityError:
        self.rejected[reason] += 1
        return CapabilityError(reason, detail)

    def check(self, cap: Capability, obj: str, right: str, now: float) -> Capability:
        """Honour ``cap`` for ``right`` on ``obj`` at time ``now``, once.

        Raises:
            CapabilityError: with the reason it is refused (counted).
        """
        if not hmac.compare_digest(cap.mac, _mac(self._key, cap.body)):
            raise self._refuse("bad_mac", "capability MAC does not verify")
        return self._admit(cap, obj, right, now)

    def check_token(
        self, token: object, obj: str, right: str, now: float
    ) -> Capability:
        """Check a wire token: the MAC over its body first (a forgery costs
        one hash), then the fields; a malformed one is counted too.

        Raises:
            CapabilityError: ``malformed``, ``bad_mac`` or the reason from
            :meth:`check`.
        """
        if not isinstance(token, str) or token.count(".") != 1 or len(token) > 2048:
            raise self._refuse("malformed", "token must be 'body.mac'")
        body_text, mac_text = token.split(".")
        try:
            body = base64.urlsafe_b64decode(body_text)
            mac = base64.urlsafe_b64decode(mac_text)
        except (binascii.Error, ValueError):
            raise self._refuse("malformed", "token is not base64url")
        if not hmac.compare_digest(mac, _mac(self._key, body)):
            raise self._refuse("bad_mac", "capability MAC does not verify")
        try:  # the issuer wrote and validated this body: check types only
            cap = Capability._from_verified(json.loads(body), mac, body)
        except (ValueError, UnicodeDecodeError, MalformedError) as exc:
            raise self._refuse("malformed", f"capability body: {exc}")
        return self._admit(cap, obj, right, now)

    def _admit(self, cap: Capability, obj: str, right: str, now: float) -> Capability:
        if now >= cap.expiry:
            raise self._refuse("expired", f"capability expired at {cap.expiry}")
        floor = self._epochs.get(cap.node, 0)
        if cap.epoch < floor:
            raise self._refuse(
                "old_epoch", f"capability epoch {cap.epoch} < node epoch {floor}"
            )
        if cap.obj != obj:
            raise self._refuse("wrong_object", f"capability is for {cap.obj!r}")
        if right not in cap.rights:
            raise self._refuse("no_right", f"capability does not grant {right!r}")
        if cap.nonce in self._seen:
            raise self._refuse("replay", "capability was already used")
        if cap.epoch > floor:  # the issuer has seen a revocation we have not
            self._epochs[cap.node] = cap.epoch
        self._seen[cap.nonce] = cap.expiry
        self.accepted += 1
        if now >= self._next_prune:
            self._prune(now)
        return cap

    def _prune(self, now: float) -> None:
        self._seen = {n: e for n, e in self._seen.items() if e > now}
        self._next_prune = int(now) + 60
