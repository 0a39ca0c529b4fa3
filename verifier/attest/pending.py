"""Nodes enrolled at boot, before their instance exists.

A tenant that boots through Nova (``trusted-nova boot``) learns the instance
UUID only when Nova accepts the request, long before the guest's agent has
registered an attestation key. It enrols the UUID at once, with V and the
policy and ``await_instance``: the node is then

``pending``
    enrolled, Nova has not reported the instance created yet. The verifier
    does not poll it.
``created``
    Nova's ``instance.create.end`` arrived (through the Nova notification
    listener, :mod:`verifier.nova_listener`): the instance exists. The
    verifier asks the registrar every quote interval whether the node's
    agent has activated its AK.
``registered``
    the AK is activated: the node joins the quote loop like any other
    enrolled node (``bootstrapping``, ``attested``, ...).

A node deleted before it got this far (``instance.delete.end``) is simply
forgotten.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import sqlalchemy as sa

from verifier.attest.clients import RegistrarClient
from verifier.attest.node import (
    LiveNode,
    NodeState,
    NodeView,
    enrolment_row,
    registration_values,
    view_of_row,
)
from verifier.attest.policies import PolicyStore
from verifier.attest.store import NodeStore
from verifier.db import Node
from verifier.exceptions import NotFoundError, RequestError
from verifier.protocol import PcrPolicy
from verifier.protocol.attestation import AttestationMode

__all__ = ["PendingNodes"]

LOG = logging.getLogger(__name__)
_WAITING = (NodeState.PENDING.value, NodeState.CREATED.value)


def is_waiting(state: str) -> bool:
    """True for nodes that are not in the quote loop yet."""
    return state in _WAITING


class PendingNodes:
    """Enrolment ahead of the instance, and promotion into the quote loop.

    Args:
        store: the node table.
        registrar: where activated AKs come from.
        adopt: puts a promoted node into the quote loop.
        owns: whether this verifier process attests a node.
        interval: seconds between registrar checks of a created node.
        clock: wall clock (seconds).
        policies: the stored runtime/measured-boot policies nodes use.
    """

    def __init__(
        self,
        store: NodeStore,
        registrar: RegistrarClient,
        adopt: Callable[[LiveNode], None],
        owns: Callable[[str], bool],
        interval: float,
        clock: Callable[[], float],
        policies: PolicyStore | None = None,
    ) -> None:
        self._store = store
        self._registrar = registrar
        self._adopt = adopt
        self._owns = owns
        self._interval = max(interval, 0.2)
        self._clock = clock
        self._created: set[str] = set()
        self._policies = policies

    async def enrol(
        self,
        uuid: str,
        v_share: bytes,
        policy: PcrPolicy,
        refs: tuple[str | None, str | None] = (None, None),
        project: str = "",
        mode: AttestationMode = AttestationMode.PULL,
        u_commitment: bytes | None = None,
        interval: float | None = None,
        follows: tuple[str | None, str | None] = (None, None),
    ) -> NodeView:
        """Store V and the policies (``refs``: runtime and measured-boot
        policy digests; ``follows``: the names they follow) for an instance
        Nova has not created yet.

        Raises:
            ConflictError: already enrolled.
        """
        # the AK, certificate and address come from the registrar on promotion
        now = self._clock()
        row = enrolment_row(
            uuid,
            v_share,
            policy,
            None,
            refs,
            now,
            project,
            mode=mode,
            u_commitment=u_commitment,
            interval=interval,
            follows=follows,
        )
        row.state = NodeState.PENDING.value
        view = view_of_row(row)  # before the commit expires the row
        await asyncio.to_thread(self._store.insert, row)
        LOG.info("Enrolled node %s ahead of its instance", uuid)
        return view

    async def instance_created(self, uuid: str) -> NodeView:
        """Nova created the instance: start waiting for its agent.

        Idempotent: a node past ``pending`` is left as it is.

        Raises:
            NotFoundError: the node is not enrolled.
        """
        row = await asyncio.to_thread(self._mark_created, uuid)
        if row is None:
            raise NotFoundError("unknown_node", f"node {uuid} is not enrolled")
        if row.state == NodeState.CREATED.value and self._owns(uuid):
            self._created.add(uuid)
            await self.try_promote(uuid)
        latest = await asyncio.to_thread(self._store.load, uuid)
        return view_of_row(latest if latest is not None else row)

    def _mark_created(self, uuid: str) -> Node | None:
        with self._store.engine.begin() as conn:
            conn.execute(
                sa.update(Node)
                .where(Node.uuid == uuid, Node.state == NodeState.PENDING.value)
                .values(state=NodeState.CREATED.value, updated_at=self._clock())
            )
        return self._store.load(uuid)

    async def try_promote(self, uuid: str) -> bool:
        """Promote a created node whose agent activated its AK.

        Returns:
            True if the node joined the quote loop (or left the created
            state otherwise, e.g. deleted or revoked).
        """
        try:
            record = await self._registrar.get_agent(uuid)
        except NotFoundError:
            return False  # the agent has not registered yet
        except RequestError as exc:
            LOG.warning("Cannot check node %s at the registrar: %s", uuid, exc)
            return False
        if not record.activated:
            return False
        values = registration_values(record)
        values.update(state=NodeState.REGISTERED.value, updated_at=self._clock())
        row = await asyncio.to_thread(self._promote, uuid, values)
        self._created.discard(uuid)
        if row is not None:
            cached = self._policies.cached if self._policies is not None else None
            self._adopt(LiveNode.from_row(row, cached))
            LOG.info("Node %s: instance created and AK activated; attesting", uuid)
        return True

    def _promote(self, uuid: str, values: dict[str, object]) -> Node | None:
        with self._store.engine.begin() as conn:
            result = conn.execute(
                sa.update(Node)
                .where(Node.uuid == uuid, Node.state == NodeState.CREATED.value)
                .values(**values)
            )
        if result.rowcount != 1:
            return None
        row = self._store.load(uuid)
        if row is not None and self._policies is not None:
            self._policies.preload([row])  # e.g. after a verifier restart
        return row

    def forget(self, uuid: str) -> None:
        self._created.discard(uuid)

    def sync(self, states: dict[str, str]) -> None:
        """Track the owned created nodes of the database (after a restart or
        a hand-over between verifiers)."""
        self._created = {
            uuid
            for uuid, state in states.items()
            if state == NodeState.CREATED.value and self._owns(uuid)
        }

    async def run(self) -> None:
        """Check the created nodes at the registrar, every interval."""
        while True:
            await asyncio.sleep(self._interval)
            for uuid in list(self._created):
                try:
                    await self.try_promote(uuid)
                except Exception:  # keep checking the others
                    LOG.exception("Promoting node %s failed", uuid)
