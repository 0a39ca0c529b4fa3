"""A node as the verifier sees it: its state, its view, its hot state."""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Mapping
from typing import Any

from verifier.db import Node
from verifier.protocol import AttestationKey, ClockState, PcrPolicy, TpmPublic

__all__ = ["LiveNode", "NodeState", "NodeView", "view_of_row"]


class NodeState(enum.StrEnum):
    #: enrolled at boot, before Nova reported the instance created
    PENDING = "pending"
    #: Nova created the instance; waiting for its agent's activated AK
    CREATED = "created"
    REGISTERED = "registered"
    BOOTSTRAPPING = "bootstrapping"
    ATTESTED = "attested"
    FAILED = "failed"
    REVOKED = "revoked"


@dataclasses.dataclass(frozen=True)
class NodeView:
    """A node's status as the API shows it (no key material)."""

    uuid: str
    state: str
    policy: Mapping[str, Any]
    failure_reason: str | None
    last_attested_at: float | None
    quotes_verified: int

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def view_of_row(row: Node) -> NodeView:
    """The view of a node this process does not attest (as last written)."""
    return NodeView(
        row.uuid,
        row.state,
        json.loads(row.policy),
        row.failure_reason,
        row.last_attested_at,
        row.quotes_verified,
    )


_POLICIES: dict[str, PcrPolicy] = {}


def shared_policy(text: str) -> PcrPolicy:
    """Parse a stored policy once per distinct text: thousands of nodes of
    one tenant share one policy object."""
    policy = _POLICIES.get(text)
    if policy is None:
        if len(_POLICIES) > 10000:
            _POLICIES.clear()
        policy = _POLICIES[text] = PcrPolicy.from_dict(json.loads(text))
    return policy


@dataclasses.dataclass(slots=True)
class LiveNode:
    """A node this process attests: its policy, AK and hot state."""

    uuid: str
    state: NodeState
    policy: PcrPolicy
    ak: AttestationKey
    base_url: str
    tls_cert: str
    v_share: bytes
    clock: ClockState | None = None
    last_attested_at: float | None = None
    quotes_verified: int = 0
    unreachable: int = 0
    failure_reason: str | None = None
    v_released: bool = False
    dirty: bool = False

    def view(self) -> NodeView:
        return NodeView(
            self.uuid,
            self.state.value,
            self.policy.to_dict(),
            self.failure_reason,
            self.last_attested_at,
            self.quotes_verified,
        )

    @classmethod
    def from_row(cls, row: Node) -> LiveNode:
        clock = None
        if row.clock is not None:
            clock = ClockState(row.reset_count or 0, row.restart_count or 0, row.clock)
        return cls(
            uuid=row.uuid,
            state=NodeState(row.state),
            policy=shared_policy(row.policy),
            ak=AttestationKey(TpmPublic.from_bytes(row.ak_public), activated=True),
            base_url=f"https://{row.host}:{row.port}",
            tls_cert=row.tls_cert,
            v_share=row.v_share,
            clock=clock,
            last_attested_at=row.last_attested_at,
            quotes_verified=row.quotes_verified,
            failure_reason=row.failure_reason,
            v_released=bool(row.v_released),
        )
