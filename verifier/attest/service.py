"""The cloud verifier: enrolled nodes, their quote loop, and revocation.

Hot state (TPM clock, last attestation time, quote counters) lives in
memory and is written behind every few seconds; state changes (attested,
failed, revoked) are written at once, and a revocation is committed in the
same transaction as its signed outbox event, exactly once even when several
verifier processes share the database (see :mod:`verifier.attest.store`).
Which nodes this process attests is decided by an
:class:`~verifier.attest.ownership.Ownership`; other nodes are served from
the database.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from cryptography.hazmat.primitives.asymmetric import ed25519

from verifier.attest.clients import AgentClient, RegistrarClient
from verifier.attest.memtrim import trim_loop
from verifier.attest.node import (
    LiveNode,
    NodeState,
    NodeView,
    enrolment_row,
)
from verifier.attest.ownership import AllNodes, Ownership
from verifier.attest.pending import PendingNodes, is_waiting
from verifier.attest.policies import PolicyStore
from verifier.attest.pull import PullAttestation
from verifier.attest.push import PushAttestation
from verifier.attest.push_store import PushStore, session_key
from verifier.attest.queries import NodeQueries
from verifier.attest.quotas import Quotas
from verifier.attest.scheduler import QuoteScheduler, background_task, wait_event
from verifier.attest.store import NodeStore
from verifier.attest.transitions import TransitionWriter
from verifier.ca import CaError, CertificateAuthority
from verifier.exceptions import (
    ConflictError,
    NotFoundError,
    RequestError,
)
from verifier.notify import Outbox
from verifier.protocol import (
    PcrPolicy,
    canonical_uuid,
    seal_share,
)
from verifier.protocol.attestation import (
    AttestationRules,
    Verdict,
)
from verifier.protocol.messages.shares import ShareV
from verifier.protocol.push import PushRules

__all__ = ["NodeState", "NodeView", "Verifier"]

if TYPE_CHECKING:  # CP-ABE is the abe extra: imported only when enabled
    from verifier.attest.abe_keys import AbeAuthority

LOG = logging.getLogger(__name__)
_FLUSH_INTERVAL = 5.0


class Verifier(NodeQueries):
    """Enrols nodes and attests the ones it owns continuously.

    Args:
        engine: the verifier database (schema already upgraded).
        signing_key: signs revocation events.
        registrar: where activated AKs come from.
        agents: the client for node agents.
        outbox: delivers revocation events.
        ca: issues node identities (None: no identities).
        interval: seconds between quotes of one node.
        max_unreachable: unanswered rounds before the unreachable action.
        max_in_flight: at most this many quote rounds run at once, so a
            large fleet or slow agents cannot exhaust sockets or memory.
        outbox_interval: seconds between outbox passes.
        clock: wall clock (seconds).
        ownership: which nodes this process attests (default: all).
        sync_interval: seconds between ownership/database syncs when
            several verifiers share the database.
        unreachable_action: ``fail`` (mark failed, keep polling) or
            ``revoke`` once a node missed ``max_unreachable`` rounds.
        policies: stored runtime and measured-boot policies (default: a
            store on ``engine`` accepting unsigned policies).
        abe: issues CP-ABE keys after valid quotes (None: off).
        quotas: per-project limits of nodes (and of policies, for the
            default policy store).
        push_rules: limits on evidence pushed by ``push`` nodes
            (:mod:`verifier.attest.push`).
        min_node_interval: the shortest quote interval a tenant may give
            a node (its verification class).
    """

    def __init__(
        self,
        engine: sa.Engine,
        signing_key: ed25519.Ed25519PrivateKey,
        registrar: RegistrarClient,
        agents: AgentClient,
        outbox: Outbox,
        ca: CertificateAuthority | None,
        interval: float,
        max_unreachable: int = 5,
        max_in_flight: int = 512,
        outbox_interval: float = 0.5,
        clock: Callable[[], float] = time.time,
        ownership: Ownership | None = None,
        sync_interval: float = 1.0,
        unreachable_action: str = "fail",
        policies: PolicyStore | None = None,
        abe: AbeAuthority | None = None,
        quotas: Quotas | None = None,
        push_rules: PushRules | None = None,
        min_node_interval: float = 1.0,
    ) -> None:
        if unreachable_action not in ("fail", "revoke"):
            raise ValueError("unreachable_action must be 'fail' or 'revoke'")
        self.store = NodeStore(engine, clock, quotas)
        self.transitions = TransitionWriter(
            self.store, signing_key, clock, self._event_written
        )
        self.policies = policies or PolicyStore(engine, clock=clock, quotas=quotas)
        self._registrar = registrar
        self._agents = agents
        self.outbox = outbox
        self._ca = ca
        self._interval = interval
        self._min_node_interval = min_node_interval
        self._scheduler = QuoteScheduler(
            self._attest_live,
            self._still_attesting,
            self.interval_of,
            max_in_flight,
            lambda node, delay: self._agents.rest(node.base_url, delay),
        )
        self.rules = AttestationRules(
            max_unreachable=max_unreachable,
            revoke_unreachable=unreachable_action == "revoke",
        )
        self._outbox_interval = outbox_interval
        self._clock = clock
        self._ownership = ownership or AllNodes()
        self._sync_interval = sync_interval
        self._nodes: dict[str, LiveNode] = {}
        self._background: list[asyncio.Task[None]] = []
        self._outbox_wakeup = asyncio.Event()
        self.abe = abe
        self.push = PushAttestation(
            self,
            push_rules or PushRules(),
            interval,
            clock,
            store=PushStore(engine, clock),
            session_key=session_key(signing_key),
        )
        self.pull = PullAttestation(self, agents, clock, self._still_attesting)
        self.pending = PendingNodes(
            self.store,
            registrar,
            self._adopt,
            lambda uuid: self._ownership.owns(uuid),
            interval,
            clock,
            self.policies,
        )

    # -- lifecycle --------------------------------------------------------

    async def start(self) -> None:
        """Join the ownership group, adopt owned nodes, start the loops."""
        await self._ownership.start()
        await self.sync()
        self.push.relay.follow_handovers()
        self._background = [  # each in a context of its own, not a request's
            background_task(self._outbox_loop()),
            background_task(self._flush_loop()),
            background_task(self.pending.run()),
            background_task(trim_loop()),  # see verifier.attest.memtrim
        ]
        self._scheduler.start()
        if not isinstance(self._ownership, AllNodes):
            self._background.append(background_task(self._sync_loop()))
        self._outbox_wakeup.set()

    async def stop(self) -> None:
        tasks = self._background + self._scheduler.stop()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._flush()
        await self._ownership.stop()
        await self._agents.close()
        await self._registrar.close()
        self.outbox.close()

    def interval_of(self, node: LiveNode) -> float:
        """Seconds between rounds of ``node``: its own quote interval (its
        verification class) or ours; a push node's visit only checks its
        deadline, at most once a second."""
        if node.mode != "pull":
            return max(self._interval, 1)
        return self._interval if node.interval is None else node.interval

    def _adopt(self, node: LiveNode) -> None:
        self._nodes[node.uuid] = node
        self.push.adopted(node.uuid)
        if node.state != NodeState.REVOKED:
            self._scheduler.schedule(node, 0.0)

    def _release(self, node: LiveNode) -> None:
        # a released node's pending heap entry is skipped when it comes due
        self._nodes.pop(node.uuid, None)
        self._agents.forget(node.base_url, node.tls_cert)  # its connection
        self.push.forget(node.uuid)

    def pause_attestation(self) -> None:
        """Stop scheduling quotes (tests and maintenance drive
        :meth:`attest_once` themselves); the API keeps working."""
        self._scheduler.stop()

    async def sync(self) -> None:
        """Reconcile with the database and the ownership: adopt nodes that
        became ours, let go of nodes that did not stay ours, and stop nodes
        that another verifier revoked or deleted."""
        await self._ownership.refresh()
        states = await asyncio.to_thread(self.store.states)
        owns = self._ownership.owns
        self.pending.sync(states)
        for uuid, node in list(self._nodes.items()):
            db_state = states.get(uuid)
            if db_state is None:
                self._release(node)
            elif db_state == NodeState.REVOKED and node.state != NodeState.REVOKED:
                node.revoked_elsewhere()
                self._release(node)
            elif not owns(uuid):
                hot = self.store.hot_rows([node])
                await asyncio.to_thread(self.store.write_hot, hot)
                self._release(node)
                LOG.info("Node %s handed to another verifier", uuid)
        wanted = [
            uuid
            for uuid, state in states.items()
            if uuid not in self._nodes
            and state != NodeState.REVOKED
            and not is_waiting(state)
            and owns(uuid)
        ]
        rows = await asyncio.to_thread(self.store.load_many, wanted)
        await asyncio.to_thread(self.policies.preload, rows)
        for row in rows:
            if row.state != NodeState.REVOKED and row.uuid not in self._nodes:
                self._adopt(LiveNode.from_row(row, self.policies.cached))
        if wanted:
            LOG.info(
                "Attesting %d more node(s); %d in all", len(wanted), len(self._nodes)
            )

    async def _sync_loop(self) -> None:
        while True:
            await asyncio.sleep(self._sync_interval)
            try:
                await self.sync()
            except Exception:  # the database or coordinator may be away
                LOG.exception("Sync with the database and the group failed")

    # -- API operations ----------------------------------------------------

    async def enrol(
        self,
        uuid: str,
        v_share: bytes,
        policy: PcrPolicy,
        runtime_policy: str | None = None,
        mb_policy: str | None = None,
        await_instance: bool = False,
        project: str = "",
        mode: str = "pull",
        u_commitment: bytes | None = None,
        interval: float | None = None,
    ) -> NodeView:
        """Start attesting ``uuid``; V is released to the node after its
        first valid quote (and runtime evidence). With ``await_instance``
        the node waits for Nova and its agent first
        (:mod:`verifier.attest.pending`).

        Args:
            uuid: the node.
            v_share: the tenant's share V.
            policy: allowed PCR values (may be empty when a runtime or
                measured-boot policy is given).
            runtime_policy: a stored IMA runtime policy (``name``,
                ``name@version`` or digest), or None.
            mb_policy: a stored measured-boot policy, or None.
            await_instance: enrol ahead of the instance.
            project: the Keystone project that will own the node (named
                policies are looked up among its policies).
            mode: ``pull`` (polled) or ``push`` (its agent posts evidence).
            u_commitment: the enroller's commitment to U, released with V
                (:mod:`verifier.protocol.enroller`).
            interval: the node's own seconds between quotes (None: ours).

        Raises:
            ConflictError: already enrolled, or the AK is not activated.
            NotFoundError: the registrar does not know the node, or a
                named policy does not exist.
            RequestError: ``no_policy`` when nothing would be checked;
                ``interval_too_short`` below ``min_node_interval``.
        """
        uuid = canonical_uuid(uuid)
        if interval is not None and interval < self._min_node_interval:
            raise RequestError(
                "interval_too_short",
                f"a node's quote interval is at least "
                f"{self._min_node_interval:g} s here",
            )
        if not policy.pcrs and runtime_policy is None and mb_policy is None:
            raise RequestError(
                "no_policy", "give a PCR, runtime or measured-boot policy"
            )
        if uuid in self._nodes:
            raise ConflictError("already_enrolled", f"node {uuid} is already enrolled")
        refs = await asyncio.to_thread(
            self.policies.resolve_pair, runtime_policy, mb_policy, project
        )
        if await_instance:
            return await self.pending.enrol(
                uuid,
                v_share,
                policy,
                refs,
                project,
                mode=mode,
                u_commitment=u_commitment,
                interval=interval,
            )
        record = await self._registrar.get_agent(uuid)
        if not record.activated:
            raise ConflictError(
                "ak_not_activated",
                f"node {uuid} has not activated its attestation key at the registrar",
            )
        row = enrolment_row(
            uuid,
            v_share,
            policy,
            record,
            refs,
            self._clock(),
            project,
            mode=mode,
            u_commitment=u_commitment,
            interval=interval,
        )
        node = LiveNode.from_row(row, self.policies.cached)
        await asyncio.to_thread(self.store.insert, row)
        if self._ownership.owns(uuid):
            self._adopt(node)
        LOG.info("Enrolled node %s (%s) with PCRs %s", uuid, mode, list(policy.pcrs))
        return node.view()

    def relay_node(self, uuid: str) -> LiveNode:
        """The node as the tenant relay needs it: the one this process
        attests, or a polled node another process attests, read from the
        database (the relay to it is stateless here: its agent is asked
        at once).

        Raises:
            NotFoundError: not enrolled, not in the quote loop yet, or a
                push node another process attests.
        """
        uuid = canonical_uuid(uuid)
        node = self._nodes.get(uuid)
        if node is not None:
            return node
        row = self.store.load(uuid)
        if row is None or is_waiting(row.state) or row.attestation_mode == "push":
            raise NotFoundError("unknown_node", f"node {uuid} is not enrolled here")
        return LiveNode.from_row(row)

    def live(self, uuid: str) -> LiveNode:
        node = self._nodes.get(canonical_uuid(uuid))
        if node is None:
            raise NotFoundError("unknown_node", f"node {uuid} is not enrolled")
        return node

    async def delete(self, uuid: str, scope: str | None = None) -> None:
        """Stop attesting and forget a node of project ``scope`` (None: of
        any project); its outbox events remain.

        Raises: NotFoundError (also for another project's node).
        """
        uuid = canonical_uuid(uuid)
        if scope is not None:
            await self.get(uuid, scope)  # another project's node: 404
        self.pending.forget(uuid)
        self.push.drop(uuid)
        node = self._nodes.get(uuid)
        if node is not None:
            self._release(node)
        if not await asyncio.to_thread(self.store.delete, uuid) and node is None:
            raise NotFoundError("unknown_node", f"node {uuid} is not enrolled")

    async def revoke(
        self, uuid: str, reason: str, detail: str, scope: str | None = None
    ) -> NodeView:
        """Revoke a node of project ``scope`` (None: any) on request (e.g.
        by its tenant), whoever attests it.

        Raises: NotFoundError (also for another project's node).
        """
        uuid = canonical_uuid(uuid)
        await self.get(uuid, scope)  # another project's node: 404
        node = self._nodes.get(uuid)
        if node is not None:
            self.transitions.act(node, node.revoke(reason, detail))
            return node.view()
        view = await self.get(uuid)
        if view.state != NodeState.REVOKED:
            self.transitions.revoke_stored(uuid, reason, detail)
        return await self.get(uuid)

    # -- the attestation loop ---------------------------------------------

    async def attest_once(self, uuid: str) -> NodeView:
        """Ask the node for one quote (more when its runtime evidence needs
        another round) and act on the verdict."""
        node = self.live(uuid)
        await self._attest_live(node)
        return node.view()

    async def _attest_live(self, node: LiveNode) -> None:
        """The scheduler's round of ``node`` (no look-up, no view: the
        quote loop runs this thousands of times a second)."""
        while await self._round(node):  # the node bounds its rounds
            pass

    async def _round(self, node: LiveNode) -> bool:
        """One quote round; True if another is needed at once.

        Fails closed: whatever goes wrong while the evidence is obtained or
        judged, V released or keys issued is a verdict on the node -- an
        answer that does not parse revokes it (``malformed``), a transport
        failure counts towards ``unreachable``, and any other error fails it
        at once (``internal_error``, :meth:`NodeAttestation.round_failed`).
        Only a database error (the verdict cannot be written; the next round
        judges again) and cancellation propagate.
        """
        if not self._still_attesting(node):
            return False
        try:
            if node.mode == "push":  # its agent posts; only its deadline here
                self.push.deadline_round(node)
                return False
            return await self.pull.round(node)
        except (asyncio.CancelledError, sa.exc.SQLAlchemyError):
            raise
        except Exception as exc:  # fail closed: see the docstring
            LOG.exception("Node %s: its quote round broke", node.uuid)
            if self._still_attesting(node):
                detail = f"{type(exc).__name__}: {exc}"
                self.transitions.act(node, node.round_failed("internal_error", detail))
            return False

    def _still_attesting(self, node: LiveNode) -> bool:
        return node.state != NodeState.REVOKED and self._nodes.get(node.uuid) is node

    def share_v(self, node: LiveNode, verdict: Verdict) -> ShareV | None:
        """V sealed to the quoted NK, the node's identity certificate (when
        the verifier has a CA and the node sent a CSR) and the enroller's
        commitment to U; None if the CSR was refused (the node is revoked)."""
        assert verdict.nk is not None  # a RELEASE_V verdict carries NK
        cert = None
        if self._ca is not None and verdict.csr is not None:
            try:
                cert = self._ca.sign_csr(verdict.csr, node.uuid).decode()
            except CaError as exc:
                self.transitions.act(node, node.revoke("csr", str(exc)))
                return None
        sealed = seal_share(verdict.nk, node.v_share, "V", node.uuid)
        return ShareV(sealed, cert, node.u_commitment)

    async def call_agent(
        self,
        node: LiveNode,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
    ) -> Mapping[str, Any]:
        """One request to ``node``'s agent (the tenant relay to polled
        nodes, :mod:`verifier.attest.relay`)."""
        return await self._agents.call(
            method, node.base_url, node.tls_cert, path, params=params, body=body
        )

    def unreachable(self, node: LiveNode, detail: str) -> None:
        verdict = node.transport_failed(detail, self.rules)
        LOG.debug("Node %s unreachable (%d): %s", node.uuid, node.unreachable, detail)
        if verdict.transition is not None:
            LOG.warning(
                "Node %s missed %d rounds: %s", node.uuid, node.unreachable, detail
            )
        self.transitions.act(node, verdict)

    # -- persistence -------------------------------------------------------

    def _event_written(self, uuid: str, revoked: bool) -> None:
        self._outbox_wakeup.set()  # deliver the event now
        if revoked and self.abe is not None:
            self.abe.revoked(uuid)

    def _flush(self) -> None:
        self.store.flush(list(self._nodes.values()))

    async def _write_behind(self) -> None:
        """The hot state of the dirty nodes, taken on the loop (where they
        change), written on a worker thread: thousands of rows every few
        seconds must not stop the quote loop or the API."""
        rows = self.store.hot_rows(self._nodes.values())
        await asyncio.to_thread(self.store.write_hot, rows)

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(_FLUSH_INTERVAL)
            try:
                await self._write_behind()
            except sa.exc.SQLAlchemyError:
                LOG.exception("Write-behind of attestation state failed")

    async def _outbox_loop(self) -> None:
        while True:
            await wait_event(self._outbox_wakeup, self._outbox_interval * 4)
            self._outbox_wakeup.clear()
            try:
                await asyncio.to_thread(
                    self.outbox.dispatch_once, 100, self._ownership.owns
                )
            except Exception:  # keep delivering whatever a driver does
                LOG.exception("Outbox delivery pass failed")
            await asyncio.sleep(self._outbox_interval)
