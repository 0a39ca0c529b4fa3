"""Compute hosts in the verifier service (trusted compute pools, issue 29):
the operator's commands and reads of ``/v1/hosts``.

A host is a node of kind ``host`` whose UUID is its compute node's
Placement resource provider; its host agent registers under that UUID.
It is polled by the ordinary quote loop (pull mode) under the operator's
policies, belongs to no project (``project_id`` empty: no tenant listing,
event query or history names it), and is enrolled without V: nothing is
ever released to a host agent, so no V is stored that could leak, and
the host is ``attested`` from its first good quote
(:mod:`verifier.protocol.attestation.hosts`).

Its policies are the caller's project's stored policies, pinned at
enrolment (a host follows no name: enrol the host again to change them).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
from collections.abc import Callable
from typing import Any

from verifier.attest.clients import RegistrarClient
from verifier.attest.host_batches import HostBatches
from verifier.attest.host_store import HOST, HostStore
from verifier.attest.host_verdicts import HostVerdicts
from verifier.attest.membership import Membership
from verifier.attest.node import LiveNode, NodeState, enrolment_row, iso8601
from verifier.attest.ownership import Ownership
from verifier.attest.policies import PolicyStore
from verifier.attest.registry import LiveNodes
from verifier.attest.store import NodeStore
from verifier.db import Host, Node
from verifier.exceptions import ConflictError, NotFoundError
from verifier.protocol import MalformedError
from verifier.protocol.attestation.hosts import host_trusted
from verifier.protocol.hostbatch import HostRound
from verifier.protocol.messages.hosts import HostEnrolmentRequest

__all__ = ["HostCommands", "HostView"]

LOG = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class HostView:
    """A host as the operator's API shows it."""

    uuid: str
    hypervisor_hostname: str
    state: str
    failure_reason: str | None
    trusted: bool | None
    as_of: float | None
    ca_path: str
    ca_sha256: str | None
    last_attested_at: float | None
    quotes_verified: int
    guests: tuple[str, ...] | None = None
    #: the latest passing host round's batch: when it was judged, how many
    #: guest quotes its host quote committed to, and their Merkle root
    last_round: HostRound | None = None

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["provider"] = self.uuid
        data["as_of"] = iso8601(self.as_of)
        data["last_attested_at"] = iso8601(self.last_attested_at)
        batch = self.last_round
        data["last_round"] = batch and {
            "at": iso8601(batch.at),
            "guests": batch.size,
            "root": batch.root.hex(),
        }
        if self.guests is None:
            del data["guests"]
        else:
            data["guests"] = list(self.guests)
        return data


def _round_of(host: Host) -> HostRound | None:
    """The host row's latest passing round (None: none, or unreadable)."""
    if not host.last_round:
        return None
    try:
        return HostRound.from_dict(json.loads(host.last_round))
    except (ValueError, MalformedError):
        return None


class HostCommands:
    """Enrols, lists, shows and deletes compute hosts.

    Args:
        hosts: the host table.
        store: the node table (a host's node row).
        nodes: the live map.
        membership: adopts and releases the hosts' nodes.
        registrar: where a host agent's activated AK comes from.
        policies: the stored policies (the caller's project's).
        ownership: which nodes this process attests.
        clock: wall clock (seconds).
        verdicts: the hosts' verdicts (told of enrolments and deletions).
        batches: the batched deep quotes (told of them too).
    """

    def __init__(
        self,
        hosts: HostStore,
        store: NodeStore,
        nodes: LiveNodes,
        membership: Membership,
        registrar: RegistrarClient,
        policies: PolicyStore,
        ownership: Ownership,
        clock: Callable[[], float],
        verdicts: HostVerdicts,
        batches: HostBatches,
    ) -> None:
        self._hosts = hosts
        self._store = store
        self._nodes = nodes
        self._membership = membership
        self._registrar = registrar
        self._policies = policies
        self._ownership = ownership
        self._clock = clock
        self._verdicts = verdicts
        self._batches = batches

    async def enrol(self, request: HostEnrolmentRequest, project: str) -> HostView:
        """Enrol a compute host, attested in pull mode from now on.

        Args:
            request: what the operator asks.
            project: the project whose stored policies are named.

        Raises:
            ConflictError: ``provider_claimed``, ``hypervisor_claimed``,
                ``tpm_claimed``; ``ak_not_activated``.
            NotFoundError: ``unknown_node`` (the registrar does not know
                the host agent), ``unknown_policy``.
        """
        uuid = request.provider
        if uuid in self._nodes:
            raise ConflictError(
                "provider_claimed", f"provider {uuid} is already enrolled"
            )
        refs = await asyncio.to_thread(
            self._policies.resolve_pair,
            request.runtime_policy,
            request.mb_policy,
            project,
        )
        record = await self._registrar.get_agent(uuid)
        if not record.activated:
            raise ConflictError(
                "ak_not_activated",
                f"host {uuid} has not activated its attestation key at the registrar",
            )
        now = self._clock()
        row = enrolment_row(
            uuid, b"", request.policy, record, refs, now, "", interval=request.interval
        )
        row.kind, row.v_released = HOST, True
        host = Host(
            uuid=uuid,
            hypervisor_hostname=request.hypervisor_hostname,
            ek_sha256=hashlib.sha256(record.ek_public.to_bytes()).hexdigest(),
            ca_path=request.ca_path,
            created_at=now,
        )
        node = LiveNode.from_row(row, self._policies.cached)
        await asyncio.to_thread(self._hosts.insert, row, host)
        self._verdicts.enrolled(uuid, request.hypervisor_hostname)
        self._batches.host_added(uuid, request.hypervisor_hostname, request.ca_path)
        if self._ownership.owns(uuid):
            self._membership.adopt(node)
        LOG.info("Enrolled compute host %s (%s)", request.hypervisor_hostname, uuid)
        return self._view(host, node.state.value, None, node.last_attested_at, 0)

    def _view(
        self,
        host: Host,
        state: str,
        failure: str | None,
        last: float | None,
        quotes: int,
        guests: tuple[str, ...] | None = None,
    ) -> HostView:
        return HostView(
            host.uuid,
            host.hypervisor_hostname,
            state,
            failure,
            host_trusted(NodeState(state), failure),
            host.verdict_at,
            host.ca_path,
            host.ca_sha256,
            last,
            quotes,
            guests,
            _round_of(host),
        )

    def _state_of(self, host: Host, row: Node | None) -> HostView:
        node = self._nodes.find(host.uuid)
        if node is not None:
            return self._view(
                host,
                node.state.value,
                node.failure_reason,
                node.last_attested_at,
                node.quotes_verified,
            )
        if row is None:
            return self._view(host, NodeState.REGISTERED.value, None, None, 0)
        return self._view(
            host,
            row.state,
            row.failure_reason,
            row.last_attested_at,
            row.quotes_verified,
        )

    async def list(self) -> list[HostView]:
        """Every enrolled host."""
        hosts = await asyncio.to_thread(self._hosts.all)
        rows = await asyncio.to_thread(self._store.load_many, [h.uuid for h in hosts])
        by_uuid = {row.uuid: row for row in rows}
        return [self._state_of(h, by_uuid.get(h.uuid)) for h in hosts]

    async def _find(self, ref: str) -> Host:
        host = await asyncio.to_thread(self._hosts.find, ref)
        if host is None:
            raise NotFoundError("unknown_host", f"host {ref} is not enrolled")
        return host

    async def get(self, ref: str) -> HostView:
        """Host ``ref`` (provider UUID or hypervisor host name), with the
        UUIDs of the guests it runs.

        Raises:
            NotFoundError: ``unknown_host``.
        """
        host = await self._find(ref)
        row = await asyncio.to_thread(self._store.load, host.uuid)
        guests = await asyncio.to_thread(
            self._hosts.guests_of, host.hypervisor_hostname
        )
        view = self._state_of(host, row)
        return dataclasses.replace(view, guests=tuple(g.uuid for g in guests))

    async def delete(self, ref: str) -> None:
        """Stop attesting host ``ref`` and forget it; its trait goes and
        the registrar learns it is no longer trusted. Its guests are not
        marked: an unenrolment is not evidence against the host.

        Raises:
            NotFoundError: ``unknown_host``.
        """
        host = await self._find(ref)
        node = self._nodes.find(host.uuid)
        if node is not None:
            self._membership.release(node)
        await asyncio.to_thread(self._hosts.delete, host.uuid)
        self._verdicts.forgotten(host.uuid, host.hypervisor_hostname)
        self._batches.host_removed(host.uuid)
        LOG.info("Compute host %s (%s) deleted", host.hypervisor_hostname, host.uuid)
