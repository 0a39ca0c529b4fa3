"""A node as the verifier's service sees it: the core's attestation state
(:class:`~verifier.protocol.attestation.NodeAttestation`) plus where to
reach its agent and the share V it is owed; its view; its row.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from verifier.db import Node
from verifier.protocol import AttestationKey, ClockState, PcrPolicy, TpmPublic
from verifier.protocol.attestation import AttestationMode, NodeAttestation, NodeState
from verifier.protocol.attestation.hosts import HOST_UNTRUSTED
from verifier.protocol.events import POLICY_KINDS
from verifier.protocol.ima import ReplayState, RuntimePolicy
from verifier.protocol.mb import MeasuredBootPolicy
from verifier.protocol.messages.registration import RegistrationRecord

__all__ = [
    "VIEW_COLUMNS",
    "LiveNode",
    "NodeState",
    "NodeView",
    "enrolment_row",
    "iso8601",
    "registration_values",
    "view_of_row",
]


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
    project_id: str = ""
    mode: AttestationMode = AttestationMode.PULL
    interval: float | None = None
    #: the names the runtime and measured-boot policies follow (None: pinned)
    follows: tuple[str | None, str | None] = (None, None)
    #: the name and version of the policies in force, by digest (filled by
    #: :meth:`~verifier.attest.queries.NodeQueries.named`)
    names: Mapping[str, tuple[str, int]] = dataclasses.field(default_factory=dict)
    #: its compute host's verdict: ``{"name", "trusted", "as_of"}`` (None:
    #: its host is not known; filled by
    #: :meth:`~verifier.attest.queries.NodeQueries.named`)
    host: Mapping[str, Any] | None = None

    @property
    def host_untrusted(self) -> bool:
        """Revoked because its compute host was found untrusted (state
        ``host_untrusted`` in the API: stored as a revocation, so every
        guard of a final state holds)."""
        return self.state == NodeState.REVOKED and (
            self.failure_reason or ""
        ).startswith(f"{HOST_UNTRUSTED}:")

    def in_force(self) -> dict[str, dict[str, Any] | None]:
        """Per policy kind, the policy in force: ``{"name", "version",
        "digest", "follows"}`` (None: no policy of that kind)."""
        out: dict[str, dict[str, Any] | None] = {}
        refs = (self.runtime_policy, self.mb_policy)
        for kind, digest, follows in zip(POLICY_KINDS, refs, self.follows, strict=True):
            if digest is None:
                out[kind] = None
                continue
            name, version = self.names.get(digest, (None, None))
            out[kind] = {
                "name": name,
                "version": version,
                "digest": digest,
                "follows": follows is not None,
            }
        return out

    def to_dict(
        self, now: float | None = None, trust_window: float | None = None
    ) -> dict[str, Any]:
        """The API's form: times in ISO 8601 (UTC, ``Z``); given ``now``,
        also the age of the last good quote and whether the node is
        ``trusted`` now: attested, with a good quote at most
        ``trust_window`` seconds old (a frozen agent stops being trusted
        before it is found unreachable)."""
        data = dataclasses.asdict(self)
        del data["follows"], data["names"]
        if self.host_untrusted:  # final, as revoked: shown by its name
            data["state"] = HOST_UNTRUSTED
        data["policies"] = self.in_force()
        last = self.last_attested_at
        data["last_attested_at"] = iso8601(last)
        if now is not None:
            age = None if last is None else max(0.0, now - last)
            data["last_attested_age"] = None if age is None else round(age, 1)
            data["trusted"] = (
                self.state == NodeState.ATTESTED
                and age is not None
                and trust_window is not None
                and age <= trust_window
            )
        return data


def iso8601(when: float | None) -> str | None:
    """``when`` (seconds since the epoch) as ISO 8601 in UTC, or None."""
    if when is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))


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
    project_id: str = "",
    mode: AttestationMode = AttestationMode.PULL,
    u_commitment: bytes | None = None,
    interval: float | None = None,
    follows: tuple[str | None, str | None] = (None, None),
) -> Node:
    """The row of a new enrolment: the registrar's ``record`` of the node
    (AK, TLS certificate, address; None before the agent registered), the
    runtime/measured-boot policy digests ``refs`` (and the names they
    ``follows``, None where pinned), the owning project and the
    attestation ``mode``, the enroller's commitment to U and the node's
    own quote ``interval`` (None: the verifier's)."""
    values = _UNREGISTERED if record is None else registration_values(record)
    return Node(
        uuid=uuid,
        project_id=project_id,
        state=NodeState.REGISTERED.value,
        policy=json.dumps(policy.to_dict()),
        v_share=v_share,
        u_commitment=u_commitment,
        **values,
        quotes_verified=0,
        v_released=False,
        created_at=now,
        updated_at=now,
        runtime_policy=refs[0],
        mb_policy=refs[1],
        attestation_mode=mode.value,
        quote_interval=interval,
        runtime_policy_follow=follows[0],
        mb_policy_follow=follows[1],
    )


#: The columns :func:`view_of_row` reads (what a list of nodes loads).
VIEW_COLUMNS = (
    Node.uuid,
    Node.state,
    Node.policy,
    Node.failure_reason,
    Node.last_attested_at,
    Node.quotes_verified,
    Node.runtime_policy,
    Node.mb_policy,
    Node.ima_count,
    Node.project_id,
    Node.attestation_mode,
    Node.quote_interval,
    Node.runtime_policy_follow,
    Node.mb_policy_follow,
)


def view_of_row(row: Node) -> NodeView:
    """The view of a node this process does not attest (as last written;
    reads only :data:`VIEW_COLUMNS`)."""
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
        row.project_id,
        _mode_of(row),
        row.quote_interval,
        _follows(row),
    )


def _follows(row: Node) -> tuple[str | None, str | None]:
    """The names ``row``'s policies follow; one shared tuple for the common
    case (nothing followed), not one per node."""
    runtime, mb = row.runtime_policy_follow, row.mb_policy_follow
    if runtime is None and mb is None:
        return _PINNED
    return (
        None if runtime is None else sys.intern(runtime),
        None if mb is None else sys.intern(mb),
    )


_PINNED: tuple[str | None, str | None] = (None, None)


def _mode_of(row: Node) -> AttestationMode:
    """The row's attestation mode (rows from before push are polled)."""
    return AttestationMode(row.attestation_mode or AttestationMode.PULL)


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


def _parsed(
    refs: tuple[str | None, str | None], policies: Callable[[str], object]
) -> tuple[RuntimePolicy | None, MeasuredBootPolicy | None]:
    """The parsed runtime and measured-boot policies of digests ``refs``."""
    runtime = None if refs[0] is None else policies(refs[0])
    mb = None if refs[1] is None else policies(refs[1])
    assert runtime is None or isinstance(runtime, RuntimePolicy)
    assert mb is None or isinstance(mb, MeasuredBootPolicy)
    return runtime, mb


def _ima_state(row: Node) -> ReplayState | None:
    pcr = row.ima_pcr
    if row.ima_count is None or pcr is None or len(pcr) != 52:
        return None
    return ReplayState(row.ima_count, pcr[:20], pcr[20:])


class LiveNode(NodeAttestation):
    """A node this process attests: its attestation state (judged by the
    core, never changed here) plus what the service's I/O needs.

    Args:
        uuid, policy, ak: as :class:`NodeAttestation`.
        base_url: its agent's ``https://host:port``.
        tls_cert: its agent's pinned TLS certificate (PEM).
        v_share: the tenant's share V, released after its first good quote.
        runtime_ref: the digest of its stored runtime policy, or None.
        mb_ref: the digest of its stored measured-boot policy, or None.
        follows: the names of the runtime and measured-boot policies it
            follows (None: the one in force is pinned).
        project_id: the Keystone project that owns it.
        mode: polled, or its agent posts evidence.
        u_commitment: the enroller's commitment to U, sent with V (None:
            enrolled before commitments).
        interval: its own quote interval, its verification class (None:
            the verifier's).
        is_host: a compute host (kind ``host``, :mod:`verifier.attest.hosts`),
            not a tenant's node.
        judged: :class:`NodeAttestation`'s keyword arguments (its state as
            last written).
    """

    __slots__ = (
        "base_url",
        "follows",
        "interval",
        "is_host",
        "mb_ref",
        "mode",
        "project_id",
        "runtime_ref",
        "tls_cert",
        "u_commitment",
        "v_share",
    )

    def __init__(
        self,
        uuid: str,
        policy: PcrPolicy,
        ak: AttestationKey,
        *,
        base_url: str,
        tls_cert: str,
        v_share: bytes,
        runtime_ref: str | None = None,
        mb_ref: str | None = None,
        project_id: str = "",
        mode: AttestationMode = AttestationMode.PULL,
        u_commitment: bytes | None = None,
        interval: float | None = None,
        follows: tuple[str | None, str | None] = (None, None),
        is_host: bool = False,
        **judged: Any,
    ) -> None:
        super().__init__(uuid, policy, ak, **judged)
        self.is_host = is_host
        self.project_id = project_id
        self.mode = mode
        self.u_commitment = u_commitment
        self.interval = interval
        self.base_url = base_url
        self.tls_cert = tls_cert
        self.v_share = v_share
        self.runtime_ref = runtime_ref
        self.mb_ref = mb_ref
        self.follows = follows

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
            self.project_id,
            self.mode,
            self.interval,
            self.follows,
        )

    def use(
        self,
        refs: tuple[str | None, str | None],
        follows: tuple[str | None, str | None],
        policies: Callable[[str], object],
    ) -> bool:
        """Judge from the next quote on with the stored runtime and
        measured-boot policies of digests ``refs`` (following the names
        ``follows``), mapped to their (loaded, shared) parsed objects by
        ``policies``; the IMA replay goes on
        (:meth:`~NodeAttestation.use_policies`).

        Returns:
            whether the policies in force changed.
        """
        self.follows = follows
        if refs == (self.runtime_ref, self.mb_ref):
            return False
        runtime, mb = _parsed(refs, policies)
        self.use_policies(runtime, mb)
        self.runtime_ref, self.mb_ref = refs
        return True

    @classmethod
    def from_row(
        cls, row: Node, policies: Callable[[str], object] | None = None
    ) -> LiveNode:
        """The live node of ``row``; ``policies`` maps a stored policy's
        digest to its (already loaded, shared) parsed object."""
        runtime: RuntimePolicy | None = None
        mb: MeasuredBootPolicy | None = None
        if policies is not None:
            runtime, mb = _parsed((row.runtime_policy, row.mb_policy), policies)
        clock = None
        if row.clock is not None:
            clock = ClockState(row.reset_count or 0, row.restart_count or 0, row.clock)
        return cls(
            row.uuid,
            shared_policy(row.policy),
            AttestationKey(TpmPublic.from_bytes(row.ak_public), activated=True),
            base_url=f"https://{row.host}:{row.port}",
            tls_cert=row.tls_cert,
            v_share=row.v_share,
            runtime_ref=row.runtime_policy,
            mb_ref=row.mb_policy,
            project_id=row.project_id or "",
            mode=_mode_of(row),
            u_commitment=row.u_commitment,
            interval=row.quote_interval,
            follows=_follows(row),
            is_host=row.kind == "host",
            state=NodeState(row.state),
            runtime=runtime,
            mb=mb,
            clock=clock,
            ima=_ima_state(row),
            last_attested_at=row.last_attested_at,
            quotes_verified=row.quotes_verified,
            failure_reason=row.failure_reason,
            v_released=bool(row.v_released),
        )
