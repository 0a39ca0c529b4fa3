"""Capabilities for attested nodes (the verifier's side of Snapdragon).

The verifier MACs a short-lived capability for a node only while that node
is attested. Its epoch is the number of events the verifier has emitted
for the node that take away what it held (revoked, failed, unreachable:
not a recovery), which is exactly how many times the key service has
bumped the node's epoch once those events were delivered, so a capability
issued after a re-attestation is honoured and every older one is not.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable

from verifier.attest.node import NodeState
from verifier.attest.queries import NodeQueries
from verifier.exceptions import ConflictError
from verifier.notify import Outbox
from verifier.protocol.capability import Capability, issue
from verifier.protocol.events import NODE_REVOKED, REVOKING_TYPES

__all__ = ["CapabilityIssuer"]


def _revoking(entry: dict[str, object]) -> bool:
    """Whether an outbox entry is an event the key service bumps the
    node's epoch on (not a recovery)."""
    signed = entry.get("signed_event")
    event = signed.get("event") if isinstance(signed, dict) else None
    kind = event.get("type", NODE_REVOKED) if isinstance(event, dict) else None
    return kind in REVOKING_TYPES


class CapabilityIssuer:
    """Issues capabilities to attested nodes.

    Args:
        queries: the verifier's nodes (whose states count).
        outbox: the verifier's revocation events (their count is the
            epoch).
        key: the MAC key shared with the key service.
        ttl: seconds a capability stays valid.
        clock: wall clock (seconds).
    """

    def __init__(
        self,
        queries: NodeQueries,
        outbox: Outbox,
        key: bytes,
        ttl: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._queries = queries
        self._outbox = outbox
        self._key = key
        self._ttl = ttl
        self._clock = clock

    async def issue(
        self, uuid: str, obj: str, rights: str, scope: str | None = None
    ) -> Capability:
        """A capability for ``uuid`` (a node of project ``scope``; None: of
        any) to use ``obj`` with ``rights``; it names the node's project,
        whose secrets alone the key service then releases to it.

        Raises:
            NotFoundError: unknown node, or another project's.
            ConflictError: ``not_attested`` unless the node is attested now.
            MalformedError: bad object or rights.
        """
        view = await self._queries.get(uuid, scope)
        if view.state != NodeState.ATTESTED:
            raise ConflictError(
                "not_attested", f"node {view.uuid} is {view.state}, not attested"
            )
        events = await asyncio.to_thread(self._outbox.list, view.uuid)
        epoch = sum(1 for e in events if _revoking(e))
        expiry = int(self._clock()) + self._ttl
        return issue(
            self._key,
            view.uuid,
            obj,
            rights,
            expiry,
            epoch,
            os.urandom(16),
            view.project_id,
        )
