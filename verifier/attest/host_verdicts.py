"""The compute hosts' verdicts and what follows from them (trusted compute
pools, issue 29).

After each round of a host, the round dispatch
(:mod:`verifier.attest.rounds`) tells :meth:`HostVerdicts.judged` the
host's state; the pure :mod:`verifier.protocol.attestation.hosts` says what
it means, and this shell applies it, calling down into the transitions:

- the verdict is written on the host's row (``trusted``, ``as_of``), which
  every guest's status shows;
- each guest of a host found untrusted is revoked with a signed
  ``node.host_untrusted`` event (reason ``host_untrusted``, final);
- the host's Placement trait is wanted only while it is trusted
  (:class:`TraitWanted`, the ``[placement]`` TraitSync);
- the registrar learns the host's trust and proven CA digest
  (:class:`RegistrarTrust`), retried until it lands.

An unreachable or failed host loses its trait and its trust at the
registrar, but its guests are not marked: silence is not evidence.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from verifier.attest.clients import RegistrarClient
from verifier.attest.host_store import HostStore
from verifier.attest.node import NodeState
from verifier.attest.registry import LiveNodes
from verifier.attest.transitions import TransitionWriter
from verifier.exceptions import RequestError
from verifier.protocol.attestation import Transition
from verifier.protocol.attestation.hosts import (
    HOST_UNTRUSTED,
    HostVerdict,
    host_trusted,
)
from verifier.protocol.events import NODE_HOST_UNTRUSTED
from verifier.protocol.messages.host_trust import HostTrustUpdate

__all__ = ["HostVerdicts", "RegistrarTrust", "TraitWanted"]

LOG = logging.getLogger(__name__)


class TraitWanted(Protocol):
    """What the host verdicts need of the Placement trait sync
    (:class:`verifier.placement.TraitSync`)."""

    def want(self, provider: str, trusted: bool) -> None: ...


class RegistrarTrust:
    """The hosts' trust on its way to the registrar: the latest report of
    each host, sent until the registrar took it (like the outbox).

    Args:
        registrar: the verifier's registrar client (mTLS, the verifier's
            service certificate).
        retry_interval: seconds between attempts while some are pending.
    """

    def __init__(self, registrar: RegistrarClient, retry_interval: float) -> None:
        self._registrar = registrar
        self._retry = retry_interval
        self._pending: dict[str, HostTrustUpdate] = {}
        self._failing: dict[str, str] = {}  # host -> its last refusal
        self._wake = asyncio.Event()

    def want(self, host: str, report: HostTrustUpdate) -> None:
        """Send ``report`` of ``host`` (replacing one not sent yet)."""
        self._pending[host] = report
        self._wake.set()

    def pending(self) -> dict[str, HostTrustUpdate]:
        return dict(self._pending)

    async def pump(self) -> None:
        """One attempt at every pending report."""
        for host, report in list(self._pending.items()):
            try:
                await self._registrar.put_host_trust(host, report)
            except RequestError as exc:  # e.g. down, or no CA of the host yet
                again = self._failing.get(host) == exc.detail
                self._failing[host] = exc.detail
                LOG.log(
                    logging.DEBUG if again else logging.WARNING,
                    "Trust of host %s not taken by the registrar yet (retried): %s",
                    host,
                    exc.detail,
                )
                continue
            self._failing.pop(host, None)
            if self._pending.get(host) is report:  # not replaced meanwhile
                del self._pending[host]

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            await self.pump()
            if self._pending:
                await asyncio.sleep(self._retry)
                self._wake.set()


class HostVerdicts:
    """Watches the hosts' states and applies their verdicts.

    Args:
        hosts: the host table (the guests' hosts).
        nodes: the live map (a guest attested here is revoked live).
        transitions: revokes the guests of an untrusted host.
        clock: wall clock (seconds).
        trust: the registrar's side (None: not told).
        traits: the Placement side (None: ``[placement]`` not configured).
    """

    def __init__(
        self,
        hosts: HostStore,
        nodes: LiveNodes,
        transitions: TransitionWriter,
        clock: Callable[[], float],
        trust: RegistrarTrust | None = None,
        traits: TraitWanted | None = None,
    ) -> None:
        self._hosts = hosts
        self._nodes = nodes
        self._transitions = transitions
        self._clock = clock
        self._trust = trust
        self._traits = traits
        #: provider UUID -> (hypervisor host name, verdict)
        self._known: dict[str, tuple[str, bool | None]] = {}

    def load(self) -> None:
        """At start: every enrolled host, its verdict from its stored state,
        stated again to Placement and the registrar (blocking)."""
        states = self._hosts.host_states()
        for row in self._hosts.all():
            state, failure = states.get(row.uuid, (NodeState.REGISTERED.value, None))
            trusted = host_trusted(NodeState(state), failure)
            self._known[row.uuid] = (row.hypervisor_hostname, trusted)
            self._announce(row.uuid, row.hypervisor_hostname, trusted, row.ca_sha256)

    def enrolled(self, uuid: str, name: str) -> None:
        self._known[uuid] = (name, None)
        self._announce(uuid, name, None, None)

    def forgotten(self, uuid: str, name: str) -> None:
        """Host ``uuid`` was deleted: no trait, no trust."""
        self._known.pop(uuid, None)
        self._announce(uuid, name, None, None)

    def judged(self, uuid: str, state: NodeState, failure: str | None) -> None:
        """Host ``uuid`` is in ``state`` after a round (written): apply what
        its verdict now means when it changed."""
        known = self._known.get(uuid) or self._adopted(uuid)
        if known is None:  # a tenant's node
            return
        name, old = known
        change = HostVerdict(uuid, name, old, host_trusted(state, failure))
        if not change.changed:
            return
        self._known[uuid] = (name, change.new)
        now = self._clock()
        self._hosts.set_verdict(uuid, change.new, now)
        LOG.warning(
            "Compute host %s (%s): trusted %s -> %s", name, uuid, old, change.new
        )
        row = self._hosts.find(uuid)
        self._announce(uuid, name, change.new, None if row is None else row.ca_sha256)
        if change.marks_guests:
            self._mark_guests(change)

    def _adopted(self, uuid: str) -> tuple[str, bool | None] | None:
        """A host this process did not know (enrolled through another
        verifier process, and adopted since), with its stored verdict."""
        node = self._nodes.find(uuid)
        if node is None or not node.is_host:
            return None
        row = self._hosts.find(uuid)
        if row is None:
            return None
        self._known[uuid] = (row.hypervisor_hostname, row.trusted)
        return self._known[uuid]

    def ca_proven(self, uuid: str, digest: str) -> None:
        """Host ``uuid``'s attested IMA list proved CA ``digest``."""
        known = self._known.get(uuid)
        self._hosts.set_ca(uuid, digest)
        if known is not None:
            self._announce(uuid, known[0], known[1], digest)

    def _announce(
        self, uuid: str, name: str, trusted: bool | None, ca: str | None
    ) -> None:
        if self._traits is not None:
            self._traits.want(uuid, trusted is True)
        if self._trust is not None:
            report = HostTrustUpdate(trusted is True, ca, uuid, self._clock())
            self._trust.want(name, report)

    def _mark_guests(self, change: HostVerdict) -> None:
        detail = change.guest_detail()
        for guest in self._hosts.guests_of(change.name):
            node = self._nodes.find(guest.uuid)
            if node is not None:
                marked = Transition(NodeState.REVOKED, HOST_UNTRUSTED, detail)
                self._transitions.revoke_live(node, marked, NODE_HOST_UNTRUSTED)
            else:
                self._transitions.revoke_stored(
                    guest.uuid, HOST_UNTRUSTED, detail, NODE_HOST_UNTRUSTED
                )
