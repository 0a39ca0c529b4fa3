"""The cloud verifier's composition root: builds the parts of one verifier
process, starts and stops them. It holds no logic of its own and none of
its parts calls back into it.

Hot state (TPM clock, last attestation time, quote counters) lives in
memory and is written behind every few seconds; state changes (attested,
failed, revoked) are written at once, and a revocation is committed in the
same transaction as its signed outbox event, exactly once even when several
verifier processes share the database (see :mod:`verifier.attest.store`).
Which nodes this process attests is decided by an
:class:`~verifier.attest.ownership.Ownership`; other nodes are served from
the database.

The parts, each calling only those below it::

    commands (enrol, delete, revoke, set policy)  queries (get, list, stats)
    checker (the dry run of a runtime policy; changes no node)
    policy switch (new versions followed, policies set)
    scheduler -> rounds -> pull | push -> relay, release; pull -> host batches
    membership (adopt, release) and its sync; pending promotions
    host commands -> host store, host verdicts
    rounds -> host verdicts -> transitions (the guests of an untrusted
              host), trait runner, registrar trust
    transitions -> store (and the log's staging), outbox pump, log pump,
                   CP-ABE authority
    log pump -> log sequencer; log reader (history, checkpoints, proofs)
    registry (the live map), write-behind
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import sqlalchemy as sa
from cryptography.hazmat.primitives.asymmetric import ed25519

from verifier.attest.clients import RegistrarClient, VerifierAgentClient
from verifier.attest.commands import NodeCommands
from verifier.attest.delivery import OutboxPump
from verifier.attest.following import PolicySwitch
from verifier.attest.gauges import VerifierGauges
from verifier.attest.host_batches import HostBatches
from verifier.attest.host_store import HostStore
from verifier.attest.host_verdicts import HostVerdicts, RegistrarTrust
from verifier.attest.hosts import HostCommands
from verifier.attest.log_pump import LogPump
from verifier.attest.membership import Membership, OwnershipSync
from verifier.attest.memdiag import configured as memory_diagnostic
from verifier.attest.memtrim import trim_loop
from verifier.attest.node import NodeState, NodeView
from verifier.attest.ownership import AllNodes, Ownership
from verifier.attest.pending import PendingNodes
from verifier.attest.policies import PolicyStore
from verifier.attest.policy_check import PolicyChecker
from verifier.attest.pull import PullAttestation
from verifier.attest.push import PushAttestation
from verifier.attest.push_store import PushStore, session_key
from verifier.attest.queries import NodeQueries
from verifier.attest.quotas import Quotas
from verifier.attest.registry import LiveNodes, WriteBehind
from verifier.attest.relay import TenantRelay
from verifier.attest.release import ShareRelease
from verifier.attest.rounds import RoundDispatch
from verifier.attest.scheduler import QuoteScheduler, background_task
from verifier.attest.settings import VerifierSettings
from verifier.attest.store import NodeStore
from verifier.attest.trait_runner import TraitRunner
from verifier.attest.transitions import TransitionWriter
from verifier.ca import CertificateAuthority
from verifier.notify import Outbox
from verifier.tlog.reads import LogReader
from verifier.tlog.sequencer import LogSequencer

__all__ = ["NodeState", "NodeView", "Verifier"]

if TYPE_CHECKING:  # CP-ABE is the abe extra: imported only when enabled
    from verifier.attest.abe_keys import AbeAuthority


class Verifier:
    """One verifier process: enrols nodes and attests the ones it owns.

    Args:
        engine: the verifier database (schema already upgraded).
        signing_key: signs revocation events.
        registrar: where activated AKs come from.
        agents: the client for node agents.
        outbox: delivers revocation events.
        ca: issues node identities (None: no identities).
        settings: intervals, limits and rules.
        clock: wall clock (seconds).
        ownership: which nodes this process attests (default: all).
        policies: stored runtime and measured-boot policies (default: a
            store on ``engine`` accepting unsigned policies).
        abe: issues CP-ABE keys after valid quotes (None: off).
        traits: keeps the trusted trait on the compute hosts' Placement
            providers (None: ``[placement]`` not configured).
        quotas: per-project limits of nodes (and of policies, for the
            default policy store).

    Attributes:
        commands, queries: the API's writes and reads of nodes.
        hosts: the API's commands and reads of compute hosts.
        host_verdicts: what the hosts' verdicts mean for their guests,
            Placement and the registrar.
        host_batches: the batched deep quotes (guest leaves per host, the
            hosts' rounds, the guests' proofs).
        log: the attestation log's reads (checkpoint, history, proofs).
        log_pump: runs the log's sequencer.
        gauges: sets the Prometheus gauges when ``/metrics`` is scraped.
        checker: the dry run of a runtime policy on live nodes.
        switch: changes the policies in force (a new version followed).
        rounds: a node's attestation round (``attest_once``).
        push: the push endpoint's side (and its tenant ``relay``).
        nodes: the nodes this process attests.
    """

    def __init__(
        self,
        engine: sa.Engine,
        signing_key: ed25519.Ed25519PrivateKey,
        registrar: RegistrarClient,
        agents: VerifierAgentClient,
        outbox: Outbox,
        ca: CertificateAuthority | None,
        settings: VerifierSettings,
        *,
        clock: Callable[[], float] = time.time,
        ownership: Ownership | None = None,
        policies: PolicyStore | None = None,
        abe: AbeAuthority | None = None,
        quotas: Quotas | None = None,
        traits: TraitRunner | None = None,
    ) -> None:
        self.settings = settings
        self._registrar = registrar
        self._agents = agents
        self.outbox = outbox
        self.abe = abe
        self.traits = traits
        self._background: list[asyncio.Task[None]] = []
        self._ownership = ownership or AllNodes()
        self.store = store = NodeStore(engine, clock, quotas)
        self.policies = policies or PolicyStore(engine, clock=clock, quotas=quotas)
        self.nodes = LiveNodes(store)
        self.write_behind = WriteBehind(store, self.nodes)
        self.pump = OutboxPump(
            outbox,
            self._ownership.owns,
            settings.outbox_interval,
            settings.event_retention_days,
            clock,
        )
        self.log = LogReader(engine)
        self.log_pump = LogPump(
            LogSequencer(engine, signing_key, clock),
            settings.log_interval,
            settings.log_retention_days,
            clock,
        )
        self.transitions = TransitionWriter(
            store,
            signing_key,
            clock,
            settings.rules,
            self.pump,
            abe,
            log_written=self.log_pump.wake,
        )
        self.switch = PolicySwitch(
            store, self.nodes, self.policies, signing_key, clock, self.pump
        )
        self.host_store = HostStore(engine, clock)
        self.host_trust = RegistrarTrust(registrar, settings.outbox_interval)
        self.host_verdicts = HostVerdicts(
            self.host_store,
            self.nodes,
            self.transitions,
            clock,
            self.host_trust,
            traits,
        )
        self._build_attestation(engine, signing_key, ca, clock)
        self._build_membership(registrar, clock)

    def _build_attestation(
        self,
        engine: sa.Engine,
        signing_key: ed25519.Ed25519PrivateKey,
        ca: CertificateAuthority | None,
        clock: Callable[[], float],
    ) -> None:
        """The rounds of both modes, the tenant relay and the scheduler."""
        settings, agents, nodes = self.settings, self._agents, self.nodes
        self.host_batches = HostBatches(self.host_store, self.host_verdicts, clock)
        release = ShareRelease(ca, self.transitions)
        push_store = PushStore(engine, clock)
        relay = TenantRelay(nodes, agents, clock, store=push_store)
        self.push = PushAttestation(
            nodes,
            self.transitions,
            release,
            relay,
            self.abe,
            settings.push_rules,
            settings.interval,
            clock,
            store=push_store,
            session_key=session_key(signing_key),
            batched=self.host_batches.guest_passed,
        )
        pull = PullAttestation(
            agents, nodes, self.transitions, release, self.abe, clock, self.host_batches
        )
        self.rounds = RoundDispatch(
            nodes, pull, self.push, self.transitions, self.host_verdicts
        )
        self.scheduler = QuoteScheduler(
            self.rounds.attest,
            nodes.attesting,
            settings.interval_of,
            settings.max_in_flight,
            lambda node, delay: agents.rest(node.base_url, delay),
        )

    def _build_membership(
        self, registrar: RegistrarClient, clock: Callable[[], float]
    ) -> None:
        """Adoption, pending promotions, the sync, and the API's sides."""
        settings, nodes, store = self.settings, self.nodes, self.store
        membership = Membership(nodes, self.scheduler, self.push, self._agents)
        self.pending = PendingNodes(
            store,
            registrar,
            membership.adopt,
            self._ownership.owns,
            settings.interval,
            clock,
            self.policies,
        )
        self.sync = OwnershipSync(
            nodes,
            membership,
            store,
            self._ownership,
            self.pending,
            self.policies,
            settings.sync_interval,
        )
        self.queries = NodeQueries(
            store,
            nodes,
            self._ownership,
            self.scheduler,
            self.policies,
            self.host_store,
        )
        self.hosts = HostCommands(
            self.host_store,
            store,
            nodes,
            membership,
            registrar,
            self.policies,
            self._ownership,
            clock,
            self.host_verdicts,
            self.host_batches,
        )
        self.gauges = VerifierGauges(
            nodes, self.scheduler, self.outbox, clock, self.log, self.host_store
        )
        self.checker = PolicyChecker(store, nodes, self.policies, self._agents)
        self.commands = NodeCommands(
            nodes,
            membership,
            self.queries,
            store,
            self.policies,
            self.pending,
            self.push,
            self.transitions,
            registrar,
            self._ownership,
            self.switch,
            settings.min_node_interval,
            clock,
            self.host_batches.placed,
            self.host_batches.forget,
        )

    async def start(self) -> None:
        """Join the ownership group, adopt owned nodes, start the loops."""
        await self._ownership.start()
        await self.sync.sync()
        # on the loop, once: it wakes the trait and trust senders (events of
        # this loop); two small queries of the hosts table
        self.host_verdicts.load()
        await asyncio.to_thread(self.host_batches.load)
        self.push.relay.follow_handovers()
        self._background = [  # each in a context of its own, not a request's
            background_task(self.pump.run()),
            background_task(self.log_pump.run()),
            background_task(self.write_behind.run()),
            background_task(self.pending.run()),
            background_task(trim_loop()),  # see verifier.attest.memtrim
            background_task(self.host_trust.run()),
        ]
        if (diagnostic := memory_diagnostic()) is not None:  # opt-in, off
            sampler, every = diagnostic
            self._background.append(background_task(sampler.run(every)))
        self.scheduler.start()
        if self.traits is not None:
            self._background.append(background_task(self.traits.run()))
        if not isinstance(self._ownership, AllNodes):
            self._background.append(background_task(self.sync.run()))
        self.pump.wake()

    async def stop(self) -> None:
        tasks = self._background + self.scheduler.stop()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.write_behind.flush()
        await self._ownership.stop()
        await self._agents.close()
        await self._registrar.close()
        self.outbox.close()

    def pause_attestation(self) -> None:
        """Stop scheduling quotes (tests and maintenance drive
        ``rounds.attest_once`` themselves); the API keeps working."""
        self.scheduler.stop()
