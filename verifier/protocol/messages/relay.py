"""The tenant's relay to push nodes (:mod:`verifier.protocol.relay`) on the
verifier's tenant API:

``POST /v1/nodes/{uuid}/relay/identity``      :class:`IdentityAsk` -> 202
``GET  /v1/nodes/{uuid}/relay/identity?nonce=HEX`` -> :class:`IdentityRelayed`
``POST /v1/nodes/{uuid}/relay/u``             :class:`~verifier.protocol.
                                              messages.shares.ShareU` -> 202
                                              :class:`URelayStatus`
``GET  /v1/nodes/{uuid}/relay/u``             -> :class:`URelayStatus`
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from verifier.protocol.errors import FieldError
from verifier.protocol.messages._fields import Reader, check_bool, check_str
from verifier.protocol.messages.quote import QuoteRequest

__all__ = ["IdentityAsk", "IdentityRelayed", "URelayStatus"]

_NAME_ASK = "identity ask"
_U_STATES = ("waiting", "delivered", "accepted", "refused")


@dataclasses.dataclass(frozen=True)
class IdentityAsk:
    """The tenant's nonce and PCRs for the node's identity quote."""

    request: QuoteRequest

    def to_dict(self) -> dict[str, Any]:
        return {"nonce": self.request.nonce.hex(), "pcrs": list(self.request.pcrs)}

    @classmethod
    def from_dict(cls, data: object) -> IdentityAsk:
        r = Reader(data, _NAME_ASK)
        nonce, pcrs = r.hex("nonce", 32), r.get("pcrs")
        r.finish()
        if not isinstance(pcrs, list):
            raise FieldError(_NAME_ASK, "pcrs", "must be a list")
        return cls(QuoteRequest(nonce, tuple(pcrs)))


@dataclasses.dataclass(frozen=True)
class IdentityRelayed:
    """The node's identity answer (a polling quote answer) once it came."""

    answer: Mapping[str, Any] | None

    _NAME = "relayed identity"

    @property
    def state(self) -> str:
        return "waiting" if self.answer is None else "answered"

    def to_dict(self) -> dict[str, Any]:
        answer = dict(self.answer) if self.answer is not None else None
        return {"state": self.state, "answer": answer}

    @classmethod
    def from_dict(cls, data: object) -> IdentityRelayed:
        r = Reader(data, cls._NAME)
        state, answer = r.get("state"), r.get("answer")
        r.finish()
        if state not in ("waiting", "answered"):
            raise FieldError(cls._NAME, "state", "must be waiting or answered")
        if (state == "answered") != isinstance(answer, Mapping):
            raise FieldError(cls._NAME, "answer", "must be an object once answered")
        return cls(answer)


@dataclasses.dataclass(frozen=True)
class URelayStatus:
    """Where the node's relayed U is."""

    state: str
    detail: str = ""
    bootstrapped: bool = False

    _NAME = "relayed U"

    def __post_init__(self) -> None:
        if self.state not in _U_STATES:
            raise FieldError(self._NAME, "state", f"must be one of {_U_STATES}")
        check_str(self._NAME, "detail", self.detail, 512, min_len=0)
        check_bool(self._NAME, "bootstrapped", self.bootstrapped)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: object) -> URelayStatus:
        r = Reader(data, cls._NAME)
        msg = cls(r.get("state"), r.get("detail"), r.get("bootstrapped"))
        r.finish()
        return msg
