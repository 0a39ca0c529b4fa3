"""The push exchange between a node agent and the verifier's push endpoint
(:mod:`verifier.protocol.push`; served by :mod:`verifier.api.push_app`).

``POST /v1/push/{uuid}/session``        -> :class:`SessionNonce`
``POST /v1/push/{uuid}/session/proof``  :class:`SessionProof` -> :class:`SessionGrant`
``POST /v1/push/{uuid}/challenge``      -> :class:`ChallengeMessage`
``POST /v1/push/{uuid}/evidence``       :class:`EvidencePost` ->
                                        :class:`EvidenceResult`

The last two carry the session token as ``Authorization: TPM-Session
<token>``. A challenge's request is the polling :class:`QuoteRequest` (as
its query parameters), and evidence is the polling
:class:`~verifier.protocol.messages.quote.QuoteAnswer`: both modes judge
the same message.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from verifier.protocol.errors import FieldError
from verifier.protocol.messages._fields import Reader, check_bool, check_str
from verifier.protocol.messages.abe import AbeKeyDelivery
from verifier.protocol.messages.quote import QuoteAnswer, QuoteRequest
from verifier.protocol.messages.shares import ShareU, ShareV
from verifier.protocol.quote import Quote

__all__ = [
    "ChallengeMessage",
    "EvidencePost",
    "EvidenceResult",
    "SessionGrant",
    "SessionNonce",
    "SessionProof",
    "UOutcome",
]

_MAX_ID = 64
_MAX_TOKEN = 128
_MAX_STATE = 32
_MAX_TIME = 1 << 40
_MAX_DETAIL = 512


def _check_time(structure: str, name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FieldError(structure, name, "must be a number")
    if not 0 <= value < _MAX_TIME:
        raise FieldError(structure, name, "is out of range")


@dataclasses.dataclass(frozen=True)
class SessionNonce:
    """The verifier's nonce to open a session with, and the PCRs to quote."""

    nonce: bytes
    pcrs: tuple[int, ...]
    expires_at: float

    _NAME = "session nonce"

    def __post_init__(self) -> None:
        QuoteRequest(self.nonce, self.pcrs)  # validates nonce and PCRs
        _check_time(self._NAME, "expires_at", self.expires_at)

    def to_dict(self) -> dict[str, Any]:
        return {
            "nonce": self.nonce.hex(),
            "pcrs": list(self.pcrs),
            "expires_at": self.expires_at,
        }

    @classmethod
    def from_dict(cls, data: object) -> SessionNonce:
        r = Reader(data, cls._NAME)
        nonce = r.hex("nonce", 32)
        pcrs = r.get("pcrs")
        if not isinstance(pcrs, list):
            raise FieldError(cls._NAME, "pcrs", "must be a list")
        msg = cls(nonce, tuple(pcrs), r.get("expires_at"))
        r.finish()
        return msg


@dataclasses.dataclass(frozen=True)
class SessionProof:
    """The agent's quote over the session nonce (and the session label),
    and the nonce's ``expires_at`` as given (it names the nonce)."""

    quote: Quote
    expires_at: float

    _NAME = "session proof"

    def __post_init__(self) -> None:
        _check_time(self._NAME, "expires_at", self.expires_at)

    def to_dict(self) -> dict[str, Any]:
        return {"quote": self.quote.to_dict(), "expires_at": self.expires_at}

    @classmethod
    def from_dict(cls, data: object) -> SessionProof:
        r = Reader(data, cls._NAME)
        msg = cls(Quote.from_dict(r.get("quote")), r.get("expires_at"))
        r.finish()
        return msg


@dataclasses.dataclass(frozen=True)
class SessionGrant:
    """A session: its bearer token, its expiry, the evidence interval."""

    token: str
    expires_at: float
    interval: float

    _NAME = "session grant"

    def __post_init__(self) -> None:
        check_str(self._NAME, "token", self.token, _MAX_TOKEN)
        _check_time(self._NAME, "expires_at", self.expires_at)
        _check_time(self._NAME, "interval", self.interval)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: object) -> SessionGrant:
        r = Reader(data, cls._NAME)
        msg = cls(r.get("token"), r.get("expires_at"), r.get("interval"))
        r.finish()
        return msg


@dataclasses.dataclass(frozen=True)
class ChallengeMessage:
    """A challenge: its id, what to send, until when."""

    id: str
    request: QuoteRequest
    expires_at: float
    identity: QuoteRequest | None = None

    _NAME = "challenge"

    def __post_init__(self) -> None:
        check_str(self._NAME, "id", self.id, _MAX_ID)
        _check_time(self._NAME, "expires_at", self.expires_at)

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id,
            "request": self.request.to_query(),
            "expires_at": self.expires_at,
        }
        if self.identity is not None:
            body["identity"] = self.identity.to_query()
        return body

    @classmethod
    def from_dict(cls, data: object) -> ChallengeMessage:
        r = Reader(data, cls._NAME)
        request = _query(cls._NAME, "request", r.get("request"))
        identity = r.get("identity")
        msg = cls(
            r.get("id"),
            request,
            r.get("expires_at"),
            _query(cls._NAME, "identity", identity) if identity is not None else None,
        )
        r.finish()
        return msg


def _query(structure: str, name: str, query: object) -> QuoteRequest:
    if not isinstance(query, Mapping) or not all(
        isinstance(v, str) for v in query.values()
    ):
        raise FieldError(structure, name, "must be an object of strings")
    return QuoteRequest.from_query(query)


@dataclasses.dataclass(frozen=True)
class EvidencePost:
    """The agent's evidence for one challenge: a polling answer."""

    challenge: str
    evidence: QuoteAnswer | Mapping[str, Any]
    #: the identity quote the challenge asked for (the tenant's nonce)
    identity: QuoteAnswer | Mapping[str, Any] | None = None
    #: what became of the U the last answer carried
    u_outcome: UOutcome | None = None
    #: the agent holds V (an answer carried it): V is delivered only once an
    #: agent says so, so a lost answer is resent. None: an agent that does
    #: not say (V counts as delivered when sent, as before).
    v_held: bool | None = None

    _NAME = "evidence post"

    def __post_init__(self) -> None:
        check_str(self._NAME, "challenge", self.challenge, _MAX_ID)
        if self.v_held is not None:
            check_bool(self._NAME, "v_held", self.v_held)

    def to_dict(self) -> dict[str, Any]:
        evidence, identity = self.evidence, self.identity
        if isinstance(evidence, QuoteAnswer):
            evidence = evidence.to_dict()
        if isinstance(identity, QuoteAnswer):
            identity = identity.to_dict()
        body: dict[str, Any] = {"challenge": self.challenge, "evidence": dict(evidence)}
        if identity is not None:
            body["identity"] = dict(identity)
        if self.u_outcome is not None:
            body["u_outcome"] = self.u_outcome.to_dict()
        if self.v_held is not None:
            body["v_held"] = self.v_held
        return body

    @classmethod
    def from_dict(cls, data: object) -> EvidencePost:
        """Parse the envelope only: the evidence is parsed by the judge
        (an answer that does not parse is a verdict, as when polled).

        Raises:
            MalformedError: naming the bad field.
        """
        r = Reader(data, cls._NAME)
        challenge, evidence = r.get("challenge"), r.get("evidence")
        identity, outcome = r.get("identity"), r.get("u_outcome")
        v_held = r.get("v_held")
        r.finish()
        if not isinstance(evidence, Mapping):
            raise FieldError(cls._NAME, "evidence", "must be an object")
        if identity is not None and not isinstance(identity, Mapping):
            raise FieldError(cls._NAME, "identity", "must be an object")
        return cls(
            challenge,
            evidence,
            identity,
            UOutcome.from_dict(outcome) if outcome is not None else None,
            v_held,
        )


@dataclasses.dataclass(frozen=True)
class UOutcome:
    """The agent's report of a relayed U: accepted (and whether that
    completed its bootstrap) or refused with a reason."""

    accepted: bool
    bootstrapped: bool = False
    detail: str = ""

    _NAME = "U outcome"

    def __post_init__(self) -> None:
        check_bool(self._NAME, "accepted", self.accepted)
        check_bool(self._NAME, "bootstrapped", self.bootstrapped)
        check_str(self._NAME, "detail", self.detail, _MAX_DETAIL, min_len=0)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: object) -> UOutcome:
        r = Reader(data, cls._NAME)
        bootstrapped, detail = r.get("bootstrapped"), r.get("detail")
        msg = cls(
            r.get("accepted"),
            False if bootstrapped is None else bootstrapped,
            "" if detail is None else detail,
        )
        r.finish()
        return msg


@dataclasses.dataclass(frozen=True)
class EvidenceResult:
    """The verifier's answer to evidence.

    Attributes:
        state: the node's state after judging.
        interval: seconds until the next evidence is due.
        v: share V and the identity certificate (first good evidence only).
        next: a follow-up challenge to answer at once (evidence incomplete).
        upcoming: the challenge to answer after ``interval`` (good
            evidence; saves the agent asking for it).
        abe: the node's CP-ABE key sealed to NK, when it is owed one.
    """

    state: str
    interval: float
    v: ShareV | None = None
    next: ChallengeMessage | None = None
    abe: AbeKeyDelivery | None = None
    upcoming: ChallengeMessage | None = None
    u: ShareU | None = None

    _NAME = "evidence result"

    def __post_init__(self) -> None:
        check_str(self._NAME, "state", self.state, _MAX_STATE)
        _check_time(self._NAME, "interval", self.interval)
        if self.abe is not None and not isinstance(self.abe, AbeKeyDelivery):
            raise FieldError(self._NAME, "abe", "must be a key delivery")

    def to_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "interval": self.interval,
            "v": self.v.to_dict() if self.v is not None else None,
            "next": self.next.to_dict() if self.next is not None else None,
            "abe": self.abe.to_dict() if self.abe is not None else None,
            "upcoming": self.upcoming.to_dict() if self.upcoming else None,
            "u": self.u.to_dict() if self.u is not None else None,
        }

    @classmethod
    def from_dict(cls, data: object) -> EvidenceResult:
        r = Reader(data, cls._NAME)
        v, nxt, abe = r.get("v"), r.get("next"), r.get("abe")
        upcoming, u = r.get("upcoming"), r.get("u")
        msg = cls(
            r.get("state"),
            r.get("interval"),
            ShareV.from_dict(v) if v is not None else None,
            ChallengeMessage.from_dict(nxt) if nxt is not None else None,
            AbeKeyDelivery.from_dict(abe) if abe is not None else None,
            ChallengeMessage.from_dict(upcoming) if upcoming is not None else None,
            ShareU.from_dict(u) if u is not None else None,
        )
        r.finish()
        return msg
