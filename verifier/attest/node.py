"""A node as the verifier sees it: its state, its view, its hot state."""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Callable, Mapping
from typing import Any

from verifier.db import Node
from verifier.protocol import AttestationKey, ClockState, PcrPolicy, TpmPublic
from verifier.protocol.evidence import BOOT_PCRS
from verifier.protocol.ima import ReplayState, RuntimePolicy
from verifier.protocol.ima.log import IMA_PCR
from verifier.protocol.mb import MeasuredBootPolicy
from verifier.protocol.messages.registration import RegistrationRecord

__all__ = [
    "LiveNode",
    "NodeState",
    "NodeView",
    "enrolment_row",
    "registration_values",
    "view_of_row",
]


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
    runtime_policy: str | None = None
    mb_policy: str | None = None
    ima_entries: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def registration_values(record: RegistrationRecord) -> dict[str, Any]:
    """The node row's columns that come from the registrar's ``record``:
    the AK, the TLS certificate to pin and the agent's address."""
    return {
        "ak_public": record.ak_public.to_bytes(),
        "tls_cert": record.tls_cert,
        "host": record.host,
        "port": record.port,
    }


#: The registrar columns of a node enrolled before its agent registered.
_UNREGISTERED = {"ak_public": b"", "tls_cert": "", "host": "", "port": 0}


def enrolment_row(
    uuid: str,
    v_share: bytes,
    policy: PcrPolicy,
    record: RegistrationRecord | None,
    refs: tuple[str | None, str | None],
    now: float,
) -> Node:
    """The row of a new enrolment: the registrar's ``record`` of the node
    (AK, TLS certificate, address; None before the agent registered) and
    the runtime/measured-boot policy digests ``refs``."""
    values = _UNREGISTERED if record is None else registration_values(record)
    return Node(
        uuid=uuid,
        state=NodeState.REGISTERED.value,
        policy=json.dumps(policy.to_dict()),
        v_share=v_share,
        **values,
        quotes_verified=0,
        v_released=False,
        created_at=now,
        updated_at=now,
        runtime_policy=refs[0],
        mb_policy=refs[1],
    )


def view_of_row(row: Node) -> NodeView:
    """The view of a node this process does not attest (as last written)."""
    return NodeView(
        row.uuid,
        row.state,
        json.loads(row.policy),
        row.failure_reason,
        row.last_attested_at,
        row.quotes_verified,
        row.runtime_policy,
        row.mb_policy,
        row.ima_count,
    )


_POLICIES: dict[str, PcrPolicy] = {}


def shared_policy(text: str) -> PcrPolicy:
    """Parse a stored policy once per distinct text: thousands of nodes of
    one tenant share one policy object."""
    policy = _POLICIES.get(text)
    if policy is None:
        if len(_POLICIES) > 10000:
            _POLICIES.clear()
        policy = _POLICIES[text] = PcrPolicy.from_dict(
            json.loads(text), allow_empty=True
        )
    return policy


def _ima_state(row: Node) -> ReplayState:
    pcr = row.ima_pcr
    if row.ima_count is None or pcr is None or len(pcr) != 52:
        return ReplayState()
    return ReplayState(row.ima_count, pcr[:20], pcr[20:])


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
    runtime_ref: str | None = None
    runtime: RuntimePolicy | None = None
    mb_ref: str | None = None
    mb: MeasuredBootPolicy | None = None
    ima: ReplayState = ReplayState()
    mb_boot: int | None = None  # reset count of the boot whose log passed
    quoted_pcrs: str = ""

    def __post_init__(self) -> None:
        pcrs = set(self.policy.pcrs)
        if self.runtime is not None:
            pcrs.add(IMA_PCR)
        if self.mb is not None:
            pcrs.update(BOOT_PCRS)
        self.quoted_pcrs = ",".join(map(str, sorted(pcrs)))

    def view(self) -> NodeView:
        return NodeView(
            self.uuid,
            self.state.value,
            self.policy.to_dict(),
            self.failure_reason,
            self.last_attested_at,
            self.quotes_verified,
            self.runtime_ref,
            self.mb_ref,
            self.ima.count if self.runtime is not None else None,
        )

    @classmethod
    def from_row(
        cls, row: Node, policies: Callable[[str], object] | None = None
    ) -> LiveNode:
        """The live node of ``row``; ``policies`` maps a stored policy's
        digest to its (already loaded, shared) parsed object."""
        runtime: RuntimePolicy | None = None
        mb: MeasuredBootPolicy | None = None
        if row.runtime_policy is not None and policies is not None:
            loaded = policies(row.runtime_policy)
            assert isinstance(loaded, RuntimePolicy)
            runtime = loaded
        if row.mb_policy is not None and policies is not None:
            loaded = policies(row.mb_policy)
            assert isinstance(loaded, MeasuredBootPolicy)
            mb = loaded
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
            runtime_ref=row.runtime_policy,
            runtime=runtime,
            mb_ref=row.mb_policy,
            mb=mb,
            ima=_ima_state(row),
        )
