"""Agent-initiated ("push") attestation: TPM sessions, challenges and the
gate every pushed evidence passes before it is judged (ARCHITECTURE
"Flows" 4).

A node on a network the verifier cannot reach pushes its evidence::

    agent                                   verifier
    open session (uuid)            ->       fresh nonce N_s
    quote over bind(N_s, LABEL)    ->       AK activated? signature? -> token
    ask for a challenge (token)    ->       Challenge: id, QuoteRequest, expiry
    evidence (token, id, answer)   ->       gate (this module), then the same
                                            NodeAttestation.judge as polling

The agent authenticates with its TPM, not an operator certificate: a
session is opened only by a quote over a verifier-chosen nonce signed by
the node's *activated* AK (:func:`check_session_proof`), and its token is
bound to that node. The evidence itself is judged exactly as a polled
answer (its quote carries the challenge's nonce bound to NK and the CSR);
this module only decides whether a post may be judged at all:

* it answers this node's outstanding challenge (``wrong_node``,
  ``unknown_challenge``), one not already answered or superseded
  (``challenge_used``), before its expiry (``challenge_expired``);
* posts and challenges come no more often than the rules allow
  (``too_frequent``), and are no larger (``evidence_too_large``).

A refused post leaves the node's attestation state unchanged: it is not
evidence. Like :mod:`verifier.protocol.attestation`, :class:`PushLedger`
does no I/O, reads no clock (``now`` is given) and makes no random values
(nonces, ids and tokens are given).
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import struct

from verifier.protocol.errors import EvidenceError, MalformedError, ProtocolError
from verifier.protocol.messages.quote import QuoteRequest
from verifier.protocol.policy import PcrPolicy
from verifier.protocol.quote import AttestationKey, Quote, bind_nonce, verify_quote

__all__ = [
    "SESSION_LABEL",
    "Challenge",
    "PushError",
    "PushLedger",
    "PushRules",
    "check_session_proof",
]

#: Bound with the session nonce into the session quote: a session proof is
#: never mistaken for attestation evidence, nor the reverse.
SESSION_LABEL = b"trusted-cloud push session v1"
_NO_PCR_POLICY = PcrPolicy({})
_NONCE_BYTES = 20


class PushError(ProtocolError):
    """A push request refused before any evidence is judged.

    Attributes:
        code: a stable code (``wrong_node``, ``unknown_challenge``,
            ``challenge_used``, ``challenge_expired``, ``too_frequent``,
            ``evidence_too_large``, ``no_session``, ``session_expired``,
            ``ak_not_activated``, ``bad_session_proof``).
        detail: what exactly was refused (never secrets).
    """

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


@dataclasses.dataclass(frozen=True, slots=True)
class PushRules:
    """The operator's limits on pushed evidence.

    Attributes:
        challenge_ttl: seconds a challenge may be answered.
        min_gap: least seconds between two challenges, and between two
            evidence posts, of one node (but for the follow-up of
            incomplete evidence, which may come at once).
        session_ttl: seconds a session token is good for.
        max_evidence_bytes: the largest evidence post.
    """

    challenge_ttl: float = 30.0
    min_gap: float = 1.0
    session_ttl: float = 3600.0
    max_evidence_bytes: int = 8 << 20

    def __post_init__(self) -> None:
        if self.challenge_ttl <= 0 or self.session_ttl <= 0 or self.min_gap < 0:
            raise ValueError("push rules: times must be positive")
        if self.max_evidence_bytes <= 0:
            raise ValueError("push rules: max_evidence_bytes must be positive")


@dataclasses.dataclass(frozen=True, slots=True)
class Challenge:
    """One challenge given to a node.

    Attributes:
        id: its identifier (chosen by the caller, unguessable).
        uuid: the node it was given to.
        request: what to send: the nonce, PCRs, CSR, IMA entries from an
            index, the firmware log (made by ``NodeAttestation.request``).
        issued_at: when.
        expires_at: the last moment its evidence is accepted.
        follow_up: it continues incomplete evidence (no rate limit).
    """

    id: str
    uuid: str
    request: QuoteRequest
    issued_at: float
    expires_at: float
    follow_up: bool = False


@dataclasses.dataclass(slots=True)
class _Session:
    uuid: str
    expires_at: float


def _token_key(token: str) -> bytes:
    # sessions are found by the token's digest: a lookup reveals nothing
    # of the tokens held, and none is kept in clear
    return hashlib.sha256(token.encode()).digest()


def session_digest(token: str) -> bytes:
    """What a session is stored and found by: SHA-256 of its token (a
    shared store never holds the bearer token itself)."""
    return _token_key(token)


def check_session_proof(ak: AttestationKey, nonce: bytes, quote: Quote) -> None:
    """Check that ``quote`` proves possession of the node's activated AK:
    signed by ``ak`` over :func:`bind_nonce` of the verifier's ``nonce``
    and :data:`SESSION_LABEL`.

    Raises:
        PushError: ``ak_not_activated`` (the registrar never saw the AK
            activated), ``bad_session_proof`` (a bad signature, another
            nonce, a quote that does not parse).
    """
    if not ak.activated:
        raise PushError("ak_not_activated", "the attestation key was never activated")
    try:
        verify_quote(
            quote,
            ak=ak,
            qualifying_data=bind_nonce(nonce, SESSION_LABEL),
            policy=_NO_PCR_POLICY,
        )
    except (EvidenceError, MalformedError) as exc:
        raise PushError("bad_session_proof", str(exc)) from None


class PushLedger:
    """Sessions and challenges of every push node of one verifier.

    Args:
        rules: the limits.
        key: the secret session nonces are made with (the same for every
            verifier process of a deployment, so that any of them checks
            a nonce another gave).
    """

    def __init__(self, rules: PushRules, key: bytes) -> None:
        if len(key) < 16:
            raise ValueError("push ledger: the session key must be 16+ bytes")
        self.rules = rules
        self._key = key
        self._sessions: dict[bytes, _Session] = {}  # token digest -> session
        self._outstanding: dict[str, Challenge] = {}  # uuid -> its challenge
        self._by_id: dict[str, Challenge] = {}  # id -> outstanding challenge
        self._spent: dict[str, tuple[str, float]] = {}  # id -> uuid, expiry
        self._issued_at: dict[str, float] = {}  # uuid -> last challenge
        self._posted_at: dict[str, float] = {}  # uuid -> last accepted post
        self._follow_up: set[str] = set()
        self._pruned_at = float("-inf")

    # -- sessions ------------------------------------------------------------

    def session_nonce(self, uuid: str, now: float) -> tuple[bytes, float]:
        """A nonce for ``uuid``'s session proof and when it expires.

        Stateless: the nonce is a MAC of the node and the expiry under
        the ledger's key, recomputed when the proof comes; asking for one
        stores nothing, so nobody can evict a node's nonce by asking for
        others."""
        expires = now + self.rules.challenge_ttl
        return self._session_mac(uuid, expires), expires

    def _session_mac(self, uuid: str, expires: float) -> bytes:
        data = uuid.encode() + struct.pack(">d", expires)
        return hmac.new(self._key, data, hashlib.sha256).digest()[:_NONCE_BYTES]

    def prove_session(
        self,
        uuid: str,
        expires: float,
        ak: AttestationKey,
        quote: Quote,
        token: str,
        now: float,
    ) -> float:
        """Open a session for ``uuid`` with ``token`` if ``quote`` proves
        its AK over the nonce :meth:`session_nonce` gave with ``expires``.

        Returns:
            When the session expires.

        Raises:
            PushError: ``session_expired`` (the nonce is too old, or claims
                an expiry it was never given), or as
                :func:`check_session_proof` (also for another node's nonce).
        """
        if not now <= expires <= now + self.rules.challenge_ttl:
            raise PushError("session_expired", "the session nonce has expired")
        check_session_proof(ak, self._session_mac(uuid, expires), quote)
        self._prune(now)
        session = _Session(uuid, now + self.rules.session_ttl)
        self._sessions[_token_key(token)] = session
        return session.expires_at

    def adopt_session(self, digest: bytes, uuid: str, expires_at: float) -> None:
        """Take a session another verifier process (or this one before a
        restart) opened: found in the shared store by ``digest``
        (:func:`session_digest`)."""
        self._sessions[digest] = _Session(uuid, expires_at)

    def session_node(self, token: str, uuid: str, now: float) -> None:
        """Check that ``token`` is a live session of node ``uuid``.

        Raises:
            PushError: ``no_session``, ``session_expired``, or ``wrong_node``
                (a session of another node).
        """
        key = _token_key(token)
        session = self._sessions.get(key)
        if session is None:
            raise PushError("no_session", "no such session: open one with the TPM")
        if session.uuid != uuid:
            raise PushError("wrong_node", f"the session is not node {uuid}'s")
        if now > session.expires_at:
            del self._sessions[key]
            raise PushError("session_expired", "the session has expired: open another")

    # -- challenges ------------------------------------------------------------

    def issue(
        self,
        uuid: str,
        challenge_id: str,
        request: QuoteRequest,
        now: float,
        ahead: bool = False,
    ) -> Challenge:
        """Give ``uuid`` a challenge (its earlier one, if any, is spent).

        ``ahead``: the challenge goes with the answer to good evidence, to
        be answered after the interval; it is not rate limited itself (the
        node did not ask), but its evidence is, like any other.

        Raises:
            PushError: ``too_frequent`` when the node asked less than
                ``min_gap`` seconds ago (unless its evidence was incomplete).
        """
        follow_up = uuid in self._follow_up
        last = self._issued_at.get(uuid)
        limited = not (follow_up or ahead)
        if limited and last is not None and now - last < self.rules.min_gap:
            raise PushError(
                "too_frequent",
                f"challenges at most every {self.rules.min_gap:g} s",
            )
        self._prune(now)
        old = self._outstanding.pop(uuid, None)
        if old is not None:
            self._spend(old)
        challenge = Challenge(
            challenge_id,
            uuid,
            request,
            now,
            now + self.rules.challenge_ttl,
            follow_up,
        )
        self._outstanding[uuid] = self._by_id[challenge_id] = challenge
        self._issued_at[uuid] = now
        self._follow_up.discard(uuid)
        return challenge

    def take(self, uuid: str, challenge_id: str, size: int, now: float) -> Challenge:
        """Accept a post of ``size`` bytes from ``uuid`` answering
        ``challenge_id``: the challenge is spent and its request returned
        to judge the evidence with. A refused post changes nothing.

        Raises:
            PushError: ``evidence_too_large``, ``challenge_used`` (answered
                or superseded), ``unknown_challenge``, ``wrong_node``,
                ``challenge_expired``, ``too_frequent``.
        """
        if size > self.rules.max_evidence_bytes:
            raise PushError(
                "evidence_too_large",
                f"evidence exceeds {self.rules.max_evidence_bytes} bytes",
            )
        spent = self._spent.get(challenge_id)
        if spent is not None:
            if spent[0] != uuid:
                raise PushError("wrong_node", f"the challenge is not node {uuid}'s")
            raise PushError("challenge_used", "the challenge was answered or replaced")
        challenge = self._by_id.get(challenge_id)
        if challenge is None:
            raise PushError("unknown_challenge", "no such challenge")
        if challenge.uuid != uuid:
            raise PushError("wrong_node", f"the challenge is not node {uuid}'s")
        if now > challenge.expires_at:
            self._drop(challenge)
            raise PushError("challenge_expired", "the challenge has expired")
        last = self._posted_at.get(uuid)
        if (
            not challenge.follow_up
            and last is not None
            and now - last < self.rules.min_gap
        ):
            raise PushError(
                "too_frequent", f"evidence at most every {self.rules.min_gap:g} s"
            )
        self._drop(challenge)
        self._posted_at[uuid] = now
        return challenge

    def follow_up(self, uuid: str) -> None:
        """The node's evidence was incomplete: its next challenge (and its
        evidence) may come at once."""
        self._follow_up.add(uuid)

    def forget(self, uuid: str) -> None:
        """Drop everything about ``uuid`` (deleted, revoked, handed over)."""
        challenge = self._outstanding.get(uuid)
        if challenge is not None:
            self._drop(challenge)
        self._issued_at.pop(uuid, None)
        self._posted_at.pop(uuid, None)
        self._follow_up.discard(uuid)
        for token in [t for t, s in self._sessions.items() if s.uuid == uuid]:
            del self._sessions[token]

    def outstanding(self, uuid: str) -> Challenge | None:
        """The node's unanswered challenge, if any."""
        return self._outstanding.get(uuid)

    def _drop(self, challenge: Challenge) -> None:
        self._outstanding.pop(challenge.uuid, None)
        self._spend(challenge)

    def _spend(self, challenge: Challenge) -> None:
        self._by_id.pop(challenge.id, None)
        # kept until it would have expired: a replay is then refused as
        # expired-or-used anyway
        self._spent[challenge.id] = (challenge.uuid, challenge.expires_at)

    def _prune(self, now: float) -> None:
        # amortized: at most once per challenge lifetime
        if now - self._pruned_at < self.rules.challenge_ttl:
            return
        self._pruned_at = now
        for cid in [c for c, (_, exp) in self._spent.items() if exp < now]:
            del self._spent[cid]
        for token in [t for t, s in self._sessions.items() if s.expires_at < now]:
            del self._sessions[token]
