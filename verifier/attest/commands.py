"""The verifier API's commands on nodes: enrol, delete, revoke, set the
policies in force.

Each checks its input, writes the database, and moves the node in or out
of this process's quote loop (:mod:`verifier.attest.membership`); the
reads are :mod:`verifier.attest.queries`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from verifier.attest.clients import RegistrarClient
from verifier.attest.following import PolicySwitch
from verifier.attest.membership import Membership
from verifier.attest.node import LiveNode, NodeState, NodeView, enrolment_row
from verifier.attest.ownership import Ownership
from verifier.attest.pending import PendingNodes
from verifier.attest.policies import KINDS, MEASURED_BOOT, RUNTIME, PolicyStore, follows
from verifier.attest.push import PushAttestation
from verifier.attest.queries import NodeQueries
from verifier.attest.registry import LiveNodes
from verifier.attest.store import NodeStore
from verifier.attest.transitions import TransitionWriter
from verifier.exceptions import ConflictError, NotFoundError, RequestError
from verifier.protocol import PcrPolicy, canonical_uuid
from verifier.protocol.attestation import AttestationMode
from verifier.protocol.messages.enrolment import EnrolmentRequest, PolicyChangeRequest
from verifier.protocol.messages.registration import RegistrationRecord

__all__ = ["EnrolmentOutcome", "NodeCommands"]

#: One enrolment's outcome in a batch: the node, or why it was refused.
EnrolmentOutcome = NodeView | RequestError
#: A pair of policy references (runtime, measured boot).
_Refs = tuple[str | None, str | None]
#: A checked request of a batch: its index, itself, its policies resolved
#: and the names they follow.
_Checked = tuple[int, EnrolmentRequest, _Refs, _Refs]

LOG = logging.getLogger(__name__)


def _not_activated(uuid: str) -> ConflictError:
    return ConflictError(
        "ak_not_activated",
        f"node {uuid} has not activated its attestation key at the registrar",
    )


class NodeCommands:
    """Enrols, deletes and revokes nodes.

    Args:
        nodes: the live map.
        membership: adopts and releases nodes.
        queries: the read side (a node of the caller's project).
        store: the node table.
        policies: the stored runtime and measured-boot policies.
        pending: enrolments ahead of the instance.
        push: the push side (a deleted node's sessions).
        transitions: revokes nodes.
        registrar: where activated AKs come from.
        ownership: which nodes this process attests.
        switch: changes the policies in force on nodes.
        min_node_interval: the shortest quote interval a tenant may give.
        clock: wall clock (seconds).
        placed: told of a node's compute host when the registrar knew it.
        forgotten: told of a deleted node (its batched deep quote state).
    """

    def __init__(
        self,
        nodes: LiveNodes,
        membership: Membership,
        queries: NodeQueries,
        store: NodeStore,
        policies: PolicyStore,
        pending: PendingNodes,
        push: PushAttestation,
        transitions: TransitionWriter,
        registrar: RegistrarClient,
        ownership: Ownership,
        switch: PolicySwitch,
        min_node_interval: float,
        clock: Callable[[], float],
        placed: Callable[[str, str], None] = lambda uuid, host: None,
        forgotten: Callable[[str], None] = lambda uuid: None,
    ) -> None:
        self._nodes = nodes
        self._membership = membership
        self._queries = queries
        self._store = store
        self._policies = policies
        self._pending = pending
        self._push = push
        self._transitions = transitions
        self._registrar = registrar
        self._ownership = ownership
        self._switch = switch
        self._min_interval = min_node_interval
        self._clock = clock
        self._placed = placed
        self._forgotten = forgotten

    async def enrol(
        self,
        uuid: str,
        v_share: bytes,
        policy: PcrPolicy,
        runtime_policy: str | None = None,
        mb_policy: str | None = None,
        await_instance: bool = False,
        project: str = "",
        mode: AttestationMode = AttestationMode.PULL,
        u_commitment: bytes | None = None,
        interval: float | None = None,
    ) -> NodeView:
        """Start attesting ``uuid`` for ``project``, polled or pushing
        (``mode``), every ``interval`` seconds (None: the verifier's); V
        (with the enroller's ``u_commitment``) is released after its first
        valid evidence. ``runtime_policy`` and ``mb_policy`` name stored
        policies of the project: a bare ``name`` follows that name (its
        newest version is in force, now and as newer ones are added);
        ``name@version`` or a digest pins one.
        With ``await_instance`` the node waits for Nova and its agent first
        (:mod:`verifier.attest.pending`).

        Raises:
            ConflictError: already enrolled, or the AK is not activated.
            NotFoundError: the registrar does not know the node, or a
                named policy does not exist.
            RequestError: ``no_policy`` when nothing would be checked;
                ``interval_too_short`` below ``min_node_interval``.
        """
        uuid, mode = canonical_uuid(uuid), AttestationMode(mode)
        self._check(uuid, policy, runtime_policy, mb_policy, interval)
        refs = await asyncio.to_thread(
            self._policies.resolve_pair, runtime_policy, mb_policy, project
        )
        names = (
            None if runtime_policy is None else follows(runtime_policy),
            None if mb_policy is None else follows(mb_policy),
        )
        if await_instance:
            return await self._pending.enrol(
                uuid,
                v_share,
                policy,
                refs,
                project,
                mode,
                u_commitment,
                interval,
                names,
            )
        record = await self._activated(uuid)
        now = self._clock()
        row = enrolment_row(
            uuid,
            v_share,
            policy,
            record,
            refs,
            now,
            project,
            mode,
            u_commitment,
            interval,
            names,
        )
        row.compute_host = host = await self._registrar.placement(uuid)
        node = LiveNode.from_row(row, self._policies.cached)
        await asyncio.to_thread(self._store.insert, row)
        if host is not None:
            self._placed(uuid, host)
        if self._ownership.owns(uuid):
            self._membership.adopt(node, fresh=True)
        LOG.info("Enrolled node %s (%s) with PCRs %s", uuid, mode, list(policy.pcrs))
        return node.view()

    async def enrol_many(
        self, requests: list[EnrolmentRequest], project: str = ""
    ) -> list[EnrolmentOutcome]:
        """Enrol a batch for ``project`` (a boot storm): each request as
        :meth:`enrol` would, with one registrar look-up for the batch (in
        requests of up to 200 nodes) and one database transaction. Each
        request's outcome is its node or the error :meth:`enrol` would have
        raised for it alone; a refused request does not stop the others.
        Requests with ``await_instance`` (no registrar record yet) are
        enrolled one by one after the others.

        Raises:
            RequestError: the registrar is unreachable, refused or answered
                malformed (502): nothing of the batch is stored.
        """
        outcome: list[EnrolmentOutcome | None] = [None] * len(requests)
        checked: list[_Checked] = []
        seen: set[str] = set()
        resolved: dict[_Refs, _Refs | RequestError] = {}
        ahead: list[tuple[int, EnrolmentRequest]] = []
        for i, req in enumerate(requests):
            try:
                if req.uuid in seen:
                    raise ConflictError(
                        "already_enrolled", f"node {req.uuid} is twice in the batch"
                    )
                seen.add(req.uuid)
                if req.await_instance:
                    ahead.append((i, req))
                    continue
                self._check(
                    req.uuid,
                    req.policy,
                    req.runtime_policy,
                    req.mb_policy,
                    req.interval,
                )
                key = (req.runtime_policy, req.mb_policy)
                if key not in resolved:
                    try:
                        resolved[key] = await asyncio.to_thread(
                            self._policies.resolve_pair, *key, project
                        )
                    except RequestError as exc:
                        resolved[key] = exc
                refs = resolved[key]
                if isinstance(refs, RequestError):
                    raise refs
                names = (
                    None if key[0] is None else follows(key[0]),
                    None if key[1] is None else follows(key[1]),
                )
                checked.append((i, req, refs, names))
            except RequestError as exc:
                outcome[i] = exc
        if checked:
            await self._enrol_checked(checked, project, outcome)
        for i, req in ahead:  # no registrar: after the batch, one by one
            try:
                outcome[i] = await self.enrol(
                    req.uuid, req.v, req.policy, req.runtime_policy,
                    req.mb_policy, True, project, req.mode, req.u_commitment,
                    req.interval,
                )  # fmt: skip
            except RequestError as exc:
                outcome[i] = exc
        return [
            o if o is not None else RequestError("internal", "not enrolled")
            for o in outcome
        ]

    async def _enrol_checked(
        self,
        checked: list[_Checked],
        project: str,
        outcome: list[EnrolmentOutcome | None],
    ) -> None:
        """:meth:`enrol_many`'s second half: the registrar's records, the
        rows, one transaction, adoption."""
        records, hosts = await self._registrar.lookup([c[1].uuid for c in checked])
        now = self._clock()
        rows, nodes, at = [], [], []
        for i, req, refs, names in checked:
            record = records.get(req.uuid)
            if record is None:
                outcome[i] = NotFoundError(
                    "unknown_node", f"the registrar does not know node {req.uuid}"
                )
                continue
            if not record.activated:
                outcome[i] = _not_activated(req.uuid)
                continue
            row = enrolment_row(
                req.uuid, req.v, req.policy, record, refs, now, project, req.mode,
                req.u_commitment, req.interval, names,
            )  # fmt: skip
            row.compute_host = hosts.get(req.uuid)
            rows.append(row)
            nodes.append(LiveNode.from_row(row, self._policies.cached))
            at.append(i)
        stored = await asyncio.to_thread(self._store.insert_many, rows) if rows else []
        for i, node, error in zip(at, nodes, stored, strict=True):
            if error is not None:
                outcome[i] = error
                continue
            host = hosts.get(node.uuid)  # the rows expired at their commit
            if host is not None:
                self._placed(node.uuid, host)
            if self._ownership.owns(node.uuid):
                self._membership.adopt(node, fresh=True)
            outcome[i] = node.view()
        LOG.info(
            "Enrolled %d of a batch of %d nodes for project %s",
            len(at) - sum(e is not None for e in stored),
            len(outcome),
            project or "-",
        )

    async def _activated(self, uuid: str) -> RegistrationRecord:
        """The registrar's record of ``uuid``, whose AK must be activated.

        Raises:
            ConflictError: ``ak_not_activated``.
            NotFoundError: the registrar does not know the node.
        """
        record = await self._registrar.get_agent(uuid)
        if not record.activated:
            raise _not_activated(uuid)
        return record

    def _check(
        self,
        uuid: str,
        policy: PcrPolicy,
        runtime_policy: str | None,
        mb_policy: str | None,
        interval: float | None,
    ) -> None:
        """Refuse an enrolment before anything is looked up (see
        :meth:`enrol`)."""
        if interval is not None and interval < self._min_interval:
            raise RequestError(
                "interval_too_short",
                f"a node's quote interval is at least {self._min_interval:g} s here",
            )
        if not policy.pcrs and runtime_policy is None and mb_policy is None:
            raise RequestError(
                "no_policy", "give a PCR, runtime or measured-boot policy"
            )
        if uuid in self._nodes:
            raise ConflictError("already_enrolled", f"node {uuid} is already enrolled")

    async def delete(self, uuid: str, scope: str | None = None) -> None:
        """Stop attesting and forget a node of project ``scope`` (None: of
        any project); its outbox events remain.

        Raises: NotFoundError (also for another project's node).
        """
        uuid = canonical_uuid(uuid)
        if scope is not None:
            await self._queries.get(uuid, scope)  # another project's node: 404
        node = self._nodes.find(uuid)
        if node is not None and node.is_host:  # a compute host: /v1/hosts
            raise NotFoundError("unknown_node", f"node {uuid} is not enrolled")
        self._pending.forget(uuid)
        self._push.drop(uuid)
        if node is not None:
            self._membership.release(node)
        self._forgotten(uuid)
        if not await asyncio.to_thread(self._store.delete, uuid) and node is None:
            raise NotFoundError("unknown_node", f"node {uuid} is not enrolled")

    async def revoke(
        self, uuid: str, reason: str, detail: str, scope: str | None = None
    ) -> NodeView:
        """Revoke a node of project ``scope`` (None: any) on request (e.g.
        by its tenant), whoever attests it.

        Raises: NotFoundError (also for another project's node).
        """
        uuid = canonical_uuid(uuid)
        await self._queries.get(uuid, scope)  # another project's node: 404
        node = self._nodes.find(uuid)
        if node is not None:
            self._transitions.act(node, node.revoke(reason, detail))
            return node.view()
        view = await self._queries.get(uuid)
        if view.state != NodeState.REVOKED:
            self._transitions.revoke_stored(uuid, reason, detail)
        return await self._queries.get(uuid)

    async def set_policy(
        self, uuid: str, change: PolicyChangeRequest, scope: str | None = None
    ) -> NodeView:
        """Change the runtime and/or measured-boot policy in force on a node
        of project ``scope`` (None: any), whoever attests it: each kind
        ``change`` names gets the policy its reference resolves to among the
        node's project's (a bare name follows it, ``name@version`` or a
        digest pins; None: no policy of that kind). The node judges with it
        from its next quote on; its IMA replay goes on. Nothing changes
        when the request is refused.

        Raises:
            NotFoundError: ``unknown_node`` (also another project's node);
                ``unknown_policy`` naming the reference.
            ConflictError: ``revoked``.
            RequestError: ``no_policy`` when nothing would be checked.
        """
        uuid = canonical_uuid(uuid)
        view = await self._queries.get(uuid, scope)  # another project's: 404
        if view.state == NodeState.REVOKED:
            raise ConflictError("revoked", f"node {uuid} is revoked")
        refs = {RUNTIME: view.runtime_policy, MEASURED_BOOT: view.mb_policy}
        wanted: dict[str, tuple[str | None, str | None]] = {}
        for kind, ref in change.refs().items():
            if ref is None:
                wanted[kind] = (None, None)
                continue
            digest = await asyncio.to_thread(
                self._policies.resolve, kind, ref, view.project_id
            )
            wanted[kind] = (digest, follows(ref))
        refs.update({kind: digest for kind, (digest, _) in wanted.items()})
        pcrs = PcrPolicy.from_dict(view.policy, allow_empty=True).pcrs
        if not pcrs and all(refs[kind] is None for kind in KINDS):
            raise RequestError(
                "no_policy",
                f"node {uuid} would have no PCR, runtime or measured-boot policy",
            )
        if await self._switch.set_policies(uuid, view.project_id, wanted) is None:
            raise ConflictError("revoked", f"node {uuid} is revoked")
        LOG.info("Node %s: policies set (%s)", uuid, ", ".join(sorted(wanted)))
        return await self._queries.get(uuid)
