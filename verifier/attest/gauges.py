"""The verifier's gauges, computed when Prometheus scrapes ``/metrics``
(doc/source/admin/monitoring.rst): nodes by state and mode, compute
hosts by verdict, the policy
versions in force, how late the most overdue quote round is, and the
outbox's depth and oldest undelivered event. Counters are counted where
things happen (:mod:`verifier.common.metrics`); these are read from the
live table, the scheduler, the outbox and the attestation log instead, so
a scrape costs one pass over this process's nodes, one query of the outbox
and one of the log.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable

from verifier.attest.host_store import HostStore
from verifier.attest.registry import LiveNodes
from verifier.attest.scheduler import QuoteScheduler
from verifier.common import metrics
from verifier.notify import Outbox
from verifier.protocol.attestation import AttestationMode, NodeState
from verifier.tlog.reads import LogReader

__all__ = ["VerifierGauges"]


class VerifierGauges:
    """Sets the verifier's gauges from its live state.

    Args:
        nodes: the nodes this process attests.
        scheduler: their quote rounds.
        outbox: the signed events (shared by every verifier process).
        clock: wall clock (seconds), the outbox's and the log's time base.
        log: the attestation log (shared by every verifier process).
        hosts: the compute hosts (shared; None: no host gauge).
    """

    def __init__(
        self,
        nodes: LiveNodes,
        scheduler: QuoteScheduler,
        outbox: Outbox,
        clock: Callable[[], float],
        log: LogReader,
        hosts: HostStore | None = None,
    ) -> None:
        self._nodes = nodes
        self._hosts = hosts
        self._log = log
        self._scheduler = scheduler
        self._outbox = outbox
        self._clock = clock

    def count_nodes(self) -> None:
        """Nodes by state and mode, and the distinct policies in force
        (every state and mode is set, absent ones to 0)."""
        counts: collections.Counter[tuple[NodeState, AttestationMode]] = (
            collections.Counter()
        )
        refs: set[str] = set()
        for node in self._nodes:
            if node.is_host:  # counted by verdict: trusted_cloud_hosts
                continue
            counts[node.state, node.mode] += 1
            if node.runtime_ref is not None:
                refs.add(node.runtime_ref)
            if node.mb_ref is not None:
                refs.add(node.mb_ref)
        for state in NodeState:
            for mode in AttestationMode:
                metrics.NODES.labels(state.value, mode.value).set(counts[state, mode])
        metrics.POLICIES_IN_FORCE.set(len(refs))
        metrics.QUOTE_LAG.set(self._scheduler.lag())

    async def refresh(self) -> None:
        """Set every gauge (the outbox read on a worker thread)."""
        self.count_nodes()
        depth, oldest = await asyncio.to_thread(self._outbox.backlog)
        metrics.OUTBOX_DEPTH.set(depth)
        age = 0.0 if oldest is None else max(0.0, self._clock() - oldest)
        metrics.OUTBOX_OLDEST_AGE.set(age)
        if self._hosts is not None:
            verdicts = await asyncio.to_thread(self._hosts.verdict_counts)
            for state in metrics.HOST_STATES:
                metrics.HOSTS.labels(state).set(verdicts.get(state, 0))
        size, waiting, staged = await asyncio.to_thread(self._log.backlog)
        metrics.LOG_ENTRIES.set(size)
        metrics.LOG_UNSEQUENCED.set(waiting)
        age = 0.0 if staged is None else max(0.0, self._clock() - staged)
        metrics.LOG_OLDEST_UNSEQUENCED_AGE.set(age)
