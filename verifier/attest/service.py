"""The cloud verifier: enrolled nodes, their quote loop, and revocation.

Hot state (TPM clock, last attestation time, quote counters) lives in
memory and is written behind every few seconds; state changes (attested,
failed, revoked) are written at once, and a revocation is committed in the
same transaction as its signed outbox event.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import enum
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import sqlalchemy as sa
from cryptography.hazmat.primitives.asymmetric import ed25519
from sqlalchemy.orm import Session

from verifier.attest.clients import AgentClient, RegistrarClient
from verifier.ca import CaError, CertificateAuthority
from verifier.db import Node
from verifier.exceptions import AgentUnreachableError, ConflictError, NotFoundError
from verifier.notify import Outbox
from verifier.notify.outbox import add_to_outbox, make_event
from verifier.protocol import (
    AttestationKey,
    ClockState,
    EvidenceError,
    MalformedError,
    PcrPolicy,
    Quote,
    TpmPublic,
    bind_nonce,
    canonical_uuid,
    seal_share,
    verify_quote,
)

LOG = logging.getLogger(__name__)
_FLUSH_INTERVAL = 5.0


class NodeState(enum.StrEnum):
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


@dataclasses.dataclass
class _Live:
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
    task: asyncio.Task[None] | None = None

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
    def from_row(cls, row: Node) -> _Live:
        clock = None
        if row.clock is not None:
            clock = ClockState(row.reset_count or 0, row.restart_count or 0, row.clock)
        return cls(
            uuid=row.uuid,
            state=NodeState(row.state),
            policy=PcrPolicy.from_dict(json.loads(row.policy)),
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


class Verifier:
    """Enrols nodes and attests them continuously.

    Args:
        engine: the verifier database (schema already upgraded).
        signing_key: signs revocation events.
        registrar: where activated AKs come from.
        agents: the client for node agents.
        outbox: delivers revocation events.
        ca: issues node identities (None: no identities).
        interval: seconds between quotes of one node.
        max_unreachable: unanswered rounds before a node is marked failed.
        max_in_flight: at most this many quote rounds run at once, so a
            large fleet or slow agents cannot exhaust sockets or memory.
        outbox_interval: seconds between outbox passes.
        clock: wall clock (seconds).
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
    ) -> None:
        self._engine = engine
        self._signing_key = signing_key
        self._registrar = registrar
        self._agents = agents
        self.outbox = outbox
        self._ca = ca
        self._interval = interval
        self._in_flight = asyncio.Semaphore(max_in_flight)
        self._max_unreachable = max_unreachable
        self._outbox_interval = outbox_interval
        self._clock = clock
        self._nodes: dict[str, _Live] = {}
        self._background: list[asyncio.Task[None]] = []
        self._outbox_wakeup = asyncio.Event()

    # -- lifecycle --------------------------------------------------------

    async def start(self) -> None:
        """Load enrolled nodes and start their loops and the outbox."""
        with Session(self._engine) as session:
            for row in session.scalars(sa.select(Node)):
                self._nodes[row.uuid] = _Live.from_row(row)
        for node in self._nodes.values():
            if node.state != NodeState.REVOKED:
                node.task = asyncio.create_task(self._run(node))
        self._background = [
            asyncio.create_task(self._outbox_loop()),
            asyncio.create_task(self._flush_loop()),
        ]
        self._outbox_wakeup.set()

    async def stop(self) -> None:
        tasks = self._background + [n.task for n in self._nodes.values() if n.task]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._flush()
        await self._agents.close()
        await self._registrar.close()

    # -- API operations ----------------------------------------------------

    async def enrol(self, uuid: str, v_share: bytes, policy: PcrPolicy) -> NodeView:
        """Start attesting ``uuid`` with ``policy``; V is released to the node
        after its first valid quote.

        Raises:
            ConflictError: already enrolled, or the AK is not activated.
            NotFoundError: the registrar does not know the node.
        """
        uuid = canonical_uuid(uuid)
        if uuid in self._nodes:
            raise ConflictError("already_enrolled", f"node {uuid} is already enrolled")
        record = await self._registrar.get_agent(uuid)
        if record.get("activated") is not True:
            raise ConflictError(
                "ak_not_activated",
                f"node {uuid} has not activated its attestation key at the registrar",
            )
        ak_public = base64.b64decode(str(record["ak_public"]))
        now = self._clock()
        row = Node(
            uuid=uuid,
            state=NodeState.REGISTERED.value,
            policy=json.dumps(policy.to_dict()),
            v_share=v_share,
            ak_public=ak_public,
            tls_cert=str(record["tls_cert"]),
            host=str(record["host"]),
            port=int(record["port"]),
            quotes_verified=0,
            created_at=now,
            updated_at=now,
        )
        node = _Live.from_row(row)
        with Session(self._engine) as session, session.begin():
            session.add(row)
        self._nodes[uuid] = node
        node.task = asyncio.create_task(self._run(node))
        LOG.info("Enrolled node %s with PCRs %s", uuid, list(policy.pcrs))
        return node.view()

    def _live(self, uuid: str) -> _Live:
        node = self._nodes.get(canonical_uuid(uuid))
        if node is None:
            raise NotFoundError("unknown_node", f"node {uuid} is not enrolled")
        return node

    def get(self, uuid: str) -> NodeView:
        """Raises: NotFoundError."""
        return self._live(uuid).view()

    def stats(self) -> dict[str, Any]:
        """Counts for operators and benchmarks: nodes per state and quotes
        verified since enrolment (as far as written or held in memory)."""
        states: dict[str, int] = {s.value: 0 for s in NodeState}
        quotes = 0
        for node in self._nodes.values():
            states[node.state.value] += 1
            quotes += node.quotes_verified
        return {"nodes": len(self._nodes), "states": states, "quotes_verified": quotes}

    def list(self) -> list[NodeView]:
        return [n.view() for n in sorted(self._nodes.values(), key=lambda n: n.uuid)]

    async def delete(self, uuid: str) -> None:
        """Stop attesting and forget a node (its outbox events remain)."""
        node = self._live(uuid)
        if node.task is not None:
            node.task.cancel()
        del self._nodes[node.uuid]
        with Session(self._engine) as session, session.begin():
            row = session.get(Node, node.uuid)
            if row is not None:
                session.delete(row)

    async def revoke(self, uuid: str, reason: str, detail: str) -> NodeView:
        """Revoke a node on request (e.g. by its tenant)."""
        node = self._live(uuid)
        if node.state != NodeState.REVOKED:
            self._revoke(node, reason, detail)
        return node.view()

    # -- the attestation loop ---------------------------------------------

    async def _run(self, node: _Live) -> None:
        while node.state != NodeState.REVOKED:
            try:
                async with self._in_flight:
                    await self.attest_once(node.uuid)
            except asyncio.CancelledError:
                raise
            except Exception:  # keep the loop alive whatever happens
                LOG.exception("Unexpected error attesting node %s", node.uuid)
            await asyncio.sleep(self._interval)

    async def attest_once(self, uuid: str) -> NodeView:
        """Ask the node for one quote and act on the verdict."""
        node = self._live(uuid)
        if node.state == NodeState.REVOKED:
            return node.view()
        first = not node.v_released
        nonce = os.urandom(20)
        params = {
            "nonce": nonce.hex(),
            "pcrs": ",".join(map(str, node.policy.pcrs)),
            "csr": "1" if first else "0",
        }
        try:
            answer = await self._agents.request(
                "GET", node.base_url, node.tls_cert, "/v1/quote", params=params
            )
        except AgentUnreachableError as exc:
            if self._still_attesting(node):
                self._unreachable(node, str(exc))
            return node.view()
        if not self._still_attesting(node):  # revoked or deleted meanwhile
            return node.view()
        try:
            nk, csr = self._check_answer(node, answer, nonce, first)
        except (EvidenceError, MalformedError) as exc:
            if isinstance(exc, EvidenceError):
                reason, detail = exc.reason, exc.detail
            else:
                reason, detail = "malformed", str(exc)
            LOG.warning("Node %s failed attestation: %s", node.uuid, exc)
            self._revoke(node, reason, detail)
            return node.view()
        if first:
            await self._release_v(node, nk, csr)
        return node.view()

    def _still_attesting(self, node: _Live) -> bool:
        return node.state != NodeState.REVOKED and self._nodes.get(node.uuid) is node

    def _check_answer(
        self, node: _Live, answer: Mapping[str, Any], nonce: bytes, first: bool
    ) -> tuple[bytes, bytes | None]:
        quote = Quote.from_dict(answer.get("quote"))
        nk = _b64(answer, "nk")
        if len(nk) != 32:
            raise MalformedError("agent answer", "'nk' is not a 32-byte X25519 key")
        csr = _b64(answer, "csr") if first else None
        bound = (nk, csr) if csr is not None else (nk,)
        verdict = verify_quote(
            quote,
            ak=node.ak,
            qualifying_data=bind_nonce(nonce, *bound),
            policy=node.policy,
            previous_clock=node.clock,
        )
        node.clock = verdict.clock
        node.last_attested_at = self._clock()
        node.quotes_verified += 1
        node.unreachable = 0
        node.dirty = True
        if node.state == NodeState.FAILED:
            back = NodeState.ATTESTED if node.v_released else NodeState.BOOTSTRAPPING
            self._set_state(node, back, None)
        return nk, csr

    async def _release_v(self, node: _Live, nk: bytes, csr: bytes | None) -> None:
        if node.state != NodeState.BOOTSTRAPPING:
            self._set_state(node, NodeState.BOOTSTRAPPING, None)
        cert = None
        if self._ca is not None and csr is not None:
            try:
                cert = self._ca.sign_csr(csr, node.uuid).decode()
            except CaError as exc:
                self._revoke(node, "csr", str(exc))
                return
        body = {
            "v": base64.b64encode(
                seal_share(nk, node.v_share, "V", node.uuid)
            ).decode(),
            "identity_cert": cert,
        }
        try:
            await self._agents.request(
                "POST", node.base_url, node.tls_cert, "/v1/keys/v", body=body
            )
        except AgentUnreachableError as exc:
            LOG.warning("Could not deliver V to node %s yet: %s", node.uuid, exc)
            return
        if not self._still_attesting(node):  # revoked while V was in flight
            return
        node.v_released = True
        self._set_state(
            node, NodeState.ATTESTED, None, identity_cert=cert, v_released=True
        )
        LOG.info("Node %s attested; V released", node.uuid)

    def _unreachable(self, node: _Live, detail: str) -> None:
        node.unreachable += 1
        LOG.info("Node %s unreachable (%d): %s", node.uuid, node.unreachable, detail)
        if node.unreachable >= self._max_unreachable and node.state != NodeState.FAILED:
            self._set_state(node, NodeState.FAILED, f"unreachable: {detail}")

    # -- persistence -------------------------------------------------------

    def _set_state(
        self, node: _Live, state: NodeState, reason: str | None, **extra: Any
    ) -> None:
        node.state = state
        node.failure_reason = reason
        with Session(self._engine) as session, session.begin():
            row = session.get(Node, node.uuid)
            if row is not None:
                self._write_hot(row, node)
                row.state, row.failure_reason = state.value, reason
                for key, value in extra.items():
                    setattr(row, key, value)

    def _revoke(self, node: _Live, reason: str, detail: str) -> None:
        now = self._clock()
        signed = make_event(self._signing_key, node.uuid, reason, detail, now)
        with Session(self._engine) as session, session.begin():
            row = session.get(Node, node.uuid)
            if row is not None:
                self._write_hot(row, node)
                row.state = NodeState.REVOKED.value
                row.failure_reason = f"{reason}: {detail}"
            add_to_outbox(session, signed, now)
        node.state = NodeState.REVOKED
        node.failure_reason = f"{reason}: {detail}"
        LOG.warning(
            "Node %s revoked (%s); event %s", node.uuid, reason, signed.event.id
        )
        self._outbox_wakeup.set()

    def _write_hot(self, row: Node, node: _Live) -> None:
        if node.clock is not None:
            row.reset_count = node.clock.reset_count
            row.restart_count = node.clock.restart_count
            row.clock = node.clock.clock
        row.last_attested_at = node.last_attested_at
        row.quotes_verified = node.quotes_verified
        row.updated_at = self._clock()
        node.dirty = False

    def _flush(self) -> None:
        dirty = [n for n in self._nodes.values() if n.dirty]
        if not dirty:
            return
        with Session(self._engine) as session, session.begin():
            for node in dirty:
                row = session.get(Node, node.uuid)
                if row is not None:
                    self._write_hot(row, node)

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(_FLUSH_INTERVAL)
            try:
                self._flush()
            except sa.exc.SQLAlchemyError:
                LOG.exception("Write-behind of attestation state failed")

    async def _outbox_loop(self) -> None:
        while True:
            try:
                await asyncio.wait_for(
                    self._outbox_wakeup.wait(), self._outbox_interval * 4
                )
            except TimeoutError:
                pass
            self._outbox_wakeup.clear()
            try:
                await asyncio.to_thread(self.outbox.dispatch_once)
            except Exception:  # keep delivering whatever a driver does
                LOG.exception("Outbox delivery pass failed")
            await asyncio.sleep(self._outbox_interval)


def _b64(answer: Mapping[str, Any], field: str) -> bytes:
    value = answer.get(field)
    if not isinstance(value, str):
        raise MalformedError("agent answer", f"'{field}' missing")
    try:
        return base64.b64decode(value, validate=True)
    except ValueError:
        raise MalformedError("agent answer", f"'{field}' is not base64")
