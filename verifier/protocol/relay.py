"""The tenant's relay to a push node through the verifier: a node in push
mode opens no port, so the tenant cannot ask it for an identity quote or
hand it U directly. Both travel through the verifier instead::

    tenant                    verifier                     agent (push)
    ask identity (nonce N_t) ->  stored for the node
                                 next challenge carries N_t ->
                             <-  evidence + identity quote over bind(N_t, NK)
    fetch the answer         <-  (checked: over N_t, by the AK)
    check it itself (check_identity_answer), as on the direct path
    post U sealed to NK      ->  stored opaque
                                 next answer carries it    ->  opens U
                             <-  next evidence says accepted / refused
    fetch the outcome        <-

The verifier is not trusted with any of it: the tenant checks the
identity quote with its own nonce and the AK the registrar activated
(:func:`check_identity_answer`, the same function as the direct path),
and U is sealed to the quoted NK (:func:`~verifier.protocol.envelope.
seal_share`, bound to the node's UUID), so the verifier never holds U in
clear nor K. What the verifier checks (:class:`RelayLedger`) only keeps
the relay honest for the tenants that share it:

* only the node's project may ask, fetch or post (``wrong_project``);
* an identity answer must be a quote by the node's AK over the nonce the
  tenant asked for (``identity_not_over_nonce``), for the challenge that
  carried it (``identity_not_asked``);
* U is posted once per node (``u_already_posted``): it is neither
  replaced by the same project nor by another, until the agent refused it;
* the envelope is a share envelope at all (``u_malformed``); one sealed
  for another node, or not decryptable, is refused by the agent (the AEAD
  binds the node's UUID), which reports ``refused`` back.

Like the rest of :mod:`verifier.protocol`, this does no I/O, reads no
clock and makes no random values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from verifier.protocol.envelope import is_share_envelope
from verifier.protocol.errors import EvidenceError, MalformedError, ProtocolError
from verifier.protocol.messages.quote import QuoteAnswer, QuoteRequest
from verifier.protocol.messages.shares import ShareU
from verifier.protocol.policy import PcrPolicy
from verifier.protocol.quote import AttestationKey, bind_nonce, verify_quote

__all__ = [
    "RelayError",
    "RelayLedger",
    "URelay",
    "check_identity_answer",
]

_NO_PCR_POLICY = PcrPolicy({})
#: Outcomes of U the agent reports.
U_STATES = ("waiting", "delivered", "accepted", "refused")


class RelayError(ProtocolError):
    """A relay request refused.

    Attributes:
        code: ``wrong_project``, ``identity_not_asked``,
            ``identity_not_over_nonce``, ``u_already_posted``,
            ``u_malformed``, ``not_asked``, ``u_not_posted``.
        detail: what was refused (never a secret).
    """

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


def check_identity_answer(
    answer: QuoteAnswer | Mapping[str, Any],
    ak: AttestationKey,
    nonce: bytes,
    policy: PcrPolicy,
) -> bytes:
    """Check a node's identity quote: signed by its activated AK over
    ``bind_nonce(nonce, NK)`` with the PCRs of ``policy``; the node's
    transport key NK, which U is then sealed to.

    The tenant calls this on both paths (the agent's answer, or the one
    the verifier relayed); the verifier trusts none of it for the tenant.

    Raises:
        EvidenceError: a bad signature, another nonce (a replay), PCRs
            off policy, an AK never activated.
        MalformedError: the answer does not parse.
    """
    parsed = (
        answer if isinstance(answer, QuoteAnswer) else QuoteAnswer.from_dict(answer)
    )
    verify_quote(
        parsed.quote,
        ak=ak,
        qualifying_data=bind_nonce(nonce, parsed.nk),
        policy=policy,
    )
    return parsed.nk


def _check_project(uuid: str, owner: str, scope: str | None) -> None:
    # scope None: an operator (any project)
    if scope is not None and scope != owner:
        raise RelayError("wrong_project", f"node {uuid} is not your project's")


@dataclasses.dataclass(slots=True)
class _IdentityAsk:
    request: QuoteRequest
    asked_at: float
    challenge: str | None = None  # the challenge that carried it
    answer: dict[str, Any] | None = None


@dataclasses.dataclass(slots=True)
class URelay:
    """U on its way to a node: opaque to the verifier.

    Attributes:
        share: the tenant's :class:`ShareU` (U sealed to NK, the payload
            sealed under K).
        state: ``waiting`` (not handed over), ``delivered`` (in an
            answer, no outcome yet), ``accepted``, ``refused``.
        detail: the agent's reason when refused.
        bootstrapped: the agent had V too and ran its payload.
    """

    share: ShareU
    state: str = "waiting"
    detail: str = ""
    bootstrapped: bool = False


class RelayLedger:
    """The relayed identity asks and U shares of every push node.

    Args:
        ask_ttl: seconds an identity ask waits for its answer.
    """

    def __init__(self, ask_ttl: float = 300.0) -> None:
        if ask_ttl <= 0:
            raise ValueError("relay: ask_ttl must be positive")
        self.ask_ttl = ask_ttl
        self._asks: dict[str, _IdentityAsk] = {}  # uuid -> the latest ask
        self._u: dict[str, URelay] = {}  # uuid -> U on its way

    # -- identity quotes ---------------------------------------------------------

    def ask_identity(
        self,
        uuid: str,
        owner: str,
        scope: str | None,
        request: QuoteRequest,
        now: float,
    ) -> None:
        """The tenant of project ``scope`` asks for an identity quote over
        its nonce with the node's next challenge (a later ask replaces an
        unanswered one).

        Raises:
            RelayError: ``wrong_project``.
        """
        _check_project(uuid, owner, scope)
        self._asks[uuid] = _IdentityAsk(request, now)

    def carry(self, uuid: str, challenge_id: str, now: float) -> QuoteRequest | None:
        """The identity request the node's challenge ``challenge_id`` carries,
        if a tenant's ask is waiting (an expired ask is dropped)."""
        ask = self._asks.get(uuid)
        if ask is None or ask.answer is not None:
            return None
        if now - ask.asked_at > self.ask_ttl:
            del self._asks[uuid]
            return None
        ask.challenge = challenge_id
        return ask.request

    def answer_identity(
        self,
        uuid: str,
        challenge_id: str,
        ak: AttestationKey,
        answer: QuoteAnswer | Mapping[str, Any],
    ) -> None:
        """Keep the agent's identity quote for the tenant if it answers the
        ask its challenge carried.

        Raises:
            RelayError: ``identity_not_asked`` (no ask rode on this
                challenge), ``identity_not_over_nonce`` (a quote over
                another nonce -- a replay --, by another key, or one that
                does not parse).
        """
        ask = self._asks.get(uuid)
        if ask is None or ask.challenge != challenge_id or ask.answer is not None:
            raise RelayError(
                "identity_not_asked", "no identity quote was asked with this challenge"
            )
        try:
            check_identity_answer(answer, ak, ask.request.nonce, _NO_PCR_POLICY)
        except (EvidenceError, MalformedError) as exc:
            raise RelayError("identity_not_over_nonce", str(exc)) from None
        if isinstance(answer, QuoteAnswer):
            answer = answer.to_dict()
        ask.answer = dict(answer)

    def identity(
        self, uuid: str, owner: str, scope: str | None, nonce: bytes
    ) -> dict[str, Any] | None:
        """The identity answer for the tenant's ``nonce``; None while the
        node has not answered yet.

        Raises:
            RelayError: ``wrong_project``; ``not_asked`` (no ask with this
                nonce, or it expired).
        """
        _check_project(uuid, owner, scope)
        ask = self._asks.get(uuid)
        if ask is None or ask.request.nonce != nonce:
            raise RelayError("not_asked", f"no identity quote was asked of node {uuid}")
        return ask.answer

    # -- U ---------------------------------------------------------------------

    def post_u(self, uuid: str, owner: str, scope: str | None, share: ShareU) -> None:
        """Keep U (opaque) for the node's next answer.

        Raises:
            RelayError: ``wrong_project``, ``u_malformed`` (not a share
                envelope), ``u_already_posted`` (unless the agent refused
                the earlier one).
        """
        _check_project(uuid, owner, scope)
        if not is_share_envelope(share.u):
            raise RelayError("u_malformed", "u is not a share envelope")
        held = self._u.get(uuid)
        if held is not None and held.state != "refused":
            raise RelayError(
                "u_already_posted", f"U for node {uuid} was posted already"
            )
        self._u[uuid] = URelay(share)

    def deliver_u(self, uuid: str) -> ShareU | None:
        """U to hand over in the node's answer: until the agent says what
        became of it (an answer may be lost)."""
        held = self._u.get(uuid)
        if held is None or held.state not in ("waiting", "delivered"):
            return None
        held.state = "delivered"
        return held.share

    def u_outcome(
        self, uuid: str, accepted: bool, detail: str, bootstrapped: bool
    ) -> None:
        """What the agent reported of U (ignored when none was delivered)."""
        held = self._u.get(uuid)
        if held is None or held.state != "delivered":
            return
        held.state = "accepted" if accepted else "refused"
        held.detail = "" if accepted else detail
        held.bootstrapped = bootstrapped
        if accepted:  # the agent has it: keep no envelope longer
            held.share = ShareU(held.share.u)

    def u_status(self, uuid: str, owner: str, scope: str | None) -> URelay | None:
        """Where the node's U is (None: none posted).

        Raises:
            RelayError: ``wrong_project``.
        """
        _check_project(uuid, owner, scope)
        return self._u.get(uuid)

    def forget(self, uuid: str) -> None:
        """Drop everything about ``uuid``."""
        self._asks.pop(uuid, None)
        self._u.pop(uuid, None)

    # -- the shared store ------------------------------------------------------

    def export(self, uuid: str) -> dict[str, Any] | None:
        """What the ledger holds of ``uuid`` as JSON-able data for a
        shared store (None: nothing); U only as its sealed envelope."""
        ask, held = self._asks.get(uuid), self._u.get(uuid)
        if ask is None and held is None:
            return None
        out: dict[str, Any] = {}
        if ask is not None:
            out["ask"] = {
                "nonce": ask.request.nonce.hex(),
                "pcrs": list(ask.request.pcrs),
                "asked_at": ask.asked_at,
                "challenge": ask.challenge,
                "answer": ask.answer,
            }
        if held is not None:
            out["u"] = {
                "share": held.share.to_dict(),
                "state": held.state,
                "detail": held.detail,
                "bootstrapped": held.bootstrapped,
            }
        return out

    def load(self, uuid: str, data: Mapping[str, Any]) -> None:
        """Take what :meth:`export` gave for ``uuid`` (replacing what is
        held of it).

        Raises:
            MalformedError: ``data`` is not an export.
        """
        try:
            ask, held = data.get("ask"), data.get("u")
            asks, us = None, None
            if ask is not None:
                request = QuoteRequest(
                    bytes.fromhex(ask["nonce"]), tuple(int(p) for p in ask["pcrs"])
                )
                answer = ask["answer"]
                if answer is not None and not isinstance(answer, dict):
                    raise TypeError("answer")
                asks = _IdentityAsk(
                    request, float(ask["asked_at"]), ask["challenge"], answer
                )
            if held is not None:
                if held["state"] not in U_STATES:
                    raise ValueError("state")
                us = URelay(
                    ShareU.from_dict(held["share"]),
                    held["state"],
                    str(held["detail"]),
                    bool(held["bootstrapped"]),
                )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise MalformedError("relay state", f"not an export: {exc}") from None
        self.forget(uuid)
        if asks is not None:
            self._asks[uuid] = asks
        if us is not None:
            self._u[uuid] = us
