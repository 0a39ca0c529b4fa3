"""Batched deep quotes in the verifier service (trusted compute pools,
issue 29; the pure core is :mod:`verifier.protocol.hostbatch`).

Each time a guest's quote passes, its leaf (instance UUID, the quote's
TPMS_ATTEST) joins the pending batch of its current compute host. At the
host's next round the batch becomes a Merkle tree and the host agent is
asked for its ordinary quote over ``host_nonce(fresh, root, size)`` (32
bytes: no agent change). When the host passes, the round is kept as a
:class:`~verifier.protocol.hostbatch.HostRound` (the latest passing one
per host, also written on the host's row) and each guest in the batch
gets its inclusion proof: its quote was made while its host was in that
attested state (:func:`~verifier.protocol.hostbatch.verify_guest_in_batch`).
One host TPM quote per host interval, whatever the number of guests.

The same round proves the host's swtpm local CA: the last measurement of
the host's CA path in the IMA entries its passing rounds replayed is its
proven CA digest (:func:`~verifier.protocol.attestation.hosts.
proven_file_digest`), told to the host verdicts (and so the registrar).

Called by :mod:`verifier.attest.pull` (calls only down).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Callable

from verifier.attest.host_store import HostStore
from verifier.attest.host_verdicts import HostVerdicts
from verifier.protocol import MalformedError
from verifier.protocol.attestation import Action, Verdict
from verifier.protocol.attestation.hosts import proven_file_digest
from verifier.protocol.evidence import ima_evidence
from verifier.protocol.hostbatch import (
    BatchProof,
    GuestBatch,
    HostRound,
    guest_leaf,
    host_nonce,
)
from verifier.protocol.messages.quote import QuoteAnswer
from verifier.protocol.tpm import TpmAttest

__all__ = ["HostBatches", "OpenRound"]

LOG = logging.getLogger(__name__)
#: The most guests one host batch holds; older leaves beyond it wait for
#: the next round (a host interval is short; this only bounds memory).
MAX_BATCH = 65536


@dataclasses.dataclass
class OpenRound:
    """A host round under way: its fresh nonce, the guests it batches and
    their tree, the nonce the host quotes, and the CA digest its parts
    have shown so far."""

    host: str
    fresh: bytes
    guests: list[tuple[str, bytes]]
    batch: GuestBatch
    nonce: bytes
    ca: bytes | None = None


@dataclasses.dataclass(frozen=True)
class GuestProof:
    """A guest's last quote, batched in a passing host round."""

    host: str
    vtpm_attest: bytes
    proof: BatchProof


class HostBatches:
    """The pending guest leaves per host, the host rounds, the proofs.

    Args:
        hosts: the host table (rounds and CA digests written there).
        verdicts: told of a proven CA digest.
        clock: wall clock (seconds).
    """

    def __init__(
        self, hosts: HostStore, verdicts: HostVerdicts, clock: Callable[[], float]
    ) -> None:
        self._store = hosts
        self._verdicts = verdicts
        self._clock = clock
        #: host provider UUID -> (hypervisor host name, CA path)
        self._hosts: dict[str, tuple[str, str]] = {}
        self._names: dict[str, str] = {}  # host name -> provider UUID
        self._placed: dict[str, str] = {}  # guest UUID -> host name
        #: by host UUID: guest UUID -> its TPMS_ATTEST, in the order they passed
        self._pending: dict[str, dict[str, bytes]] = {}
        self._open: dict[str, OpenRound] = {}
        self._ca: dict[str, bytes] = {}
        #: the latest passing round of each host
        self.rounds: dict[str, HostRound] = {}
        #: each guest's last batched quote and its proof
        self.proofs: dict[str, GuestProof] = {}

    def load(self) -> None:
        """The hosts and the guests' hosts (blocking; at start)."""
        for row in self._store.all():
            self.host_added(row.uuid, row.hypervisor_hostname, row.ca_path)
            if row.last_round:
                try:
                    self.rounds[row.uuid] = HostRound.from_dict(
                        json.loads(row.last_round)
                    )
                except (ValueError, MalformedError):
                    LOG.warning("Host %s: its stored round does not parse", row.uuid)
        self._placed.update(self._store.placements())

    def host_added(self, uuid: str, name: str, ca_path: str) -> None:
        self._hosts[uuid] = (name, ca_path)
        self._names[name] = uuid

    def host_removed(self, uuid: str) -> None:
        name, _ = self._hosts.pop(uuid, ("", ""))
        self._names.pop(name, None)
        self._pending.pop(uuid, None)
        self._open.pop(uuid, None)
        self.rounds.pop(uuid, None)
        for guest in [g for g, p in self.proofs.items() if p.host == uuid]:
            del self.proofs[guest]

    def forget(self, guest: str) -> None:
        """Guest ``guest`` was deleted: no host, no pending leaf, no proof."""
        self._placed.pop(guest, None)
        self.proofs.pop(guest, None)
        for pending in self._pending.values():
            pending.pop(guest, None)

    def placed(self, guest: str, name: str) -> None:
        """Guest ``guest`` runs on host ``name`` from now on."""
        self._placed[guest] = name

    def guest_passed(self, guest: str, attest: TpmAttest) -> None:
        """A quote of ``guest`` passed (its verified TPMS_ATTEST): batch it
        under its current host (its latest quote of the interval only)."""
        host = self._names.get(self._placed.get(guest, ""))
        if host is None:  # its host is not known or not enrolled
            return
        pending = self._pending.setdefault(host, {})
        pending.pop(guest, None)
        if len(pending) < MAX_BATCH:
            pending[guest] = attest.to_bytes()

    def begin(self, host: str) -> OpenRound:
        """The round host ``host`` is asked for now: its batch and nonce
        (a part of a round in several parts goes on with a new nonce over
        the same batch)."""
        round_ = self._open.get(host)
        if round_ is None:
            self._refresh(host)
        if round_ is not None:
            guests = round_.guests
        else:
            guests = list(self._pending.pop(host, {}).items())
        batch = GuestBatch([guest_leaf(g, a) for g, a in guests])
        fresh = os.urandom(20)
        nonce = host_nonce(fresh, batch.root, batch.size)
        opened = OpenRound(host, fresh, guests, batch, nonce)
        if round_ is not None:
            opened.ca = round_.ca
        self._open[host] = opened
        return opened

    def _refresh(self, host: str) -> None:
        """Learn (again) host ``host`` and the guests it runs, from the
        shared tables: another verifier process may have enrolled it or
        been told where guests run (one indexed query per host round)."""
        if host not in self._hosts:
            row = self._store.find(host)
            if row is None:
                return
            self.host_added(row.uuid, row.hypervisor_hostname, row.ca_path)
        name = self._hosts[host][0]
        for guest in self._store.guests_of(name):
            self._placed[guest.uuid] = name

    def finished(self, round_: OpenRound, verdict: Verdict, answer: object) -> None:
        """The host's answer to ``round_`` was judged (``verdict``): keep a
        passing round with its proofs and CA; a failed one drops its batch
        (its guests follow the host's verdict)."""
        if not verdict:
            self._open.pop(round_.host, None)
            return
        round_.ca = self._ca_in(round_, answer) or round_.ca
        if verdict.action is Action.ASK_AGAIN:
            return  # the next part goes on with the same batch
        self._open.pop(round_.host, None)
        if verdict.attest is None or verdict.nk is None:
            return
        kept = HostRound(
            round_.host,
            round_.fresh,
            round_.batch.root,
            round_.batch.size,
            verdict.attest.to_bytes(),
            self._clock(),
            True,
            (verdict.nk,),
        )
        self.rounds[round_.host] = kept
        self._store.set_round(round_.host, json.dumps(kept.to_dict()))
        for index, (guest, attest) in enumerate(round_.guests):
            self.proofs[guest] = GuestProof(
                round_.host, attest, round_.batch.proof(index)
            )
        if round_.ca is not None and self._ca.get(round_.host) != round_.ca:
            self._ca[round_.host] = round_.ca
            self._verdicts.ca_proven(round_.host, round_.ca.hex())

    def _ca_in(self, round_: OpenRound, answer: object) -> bytes | None:
        """The CA digest the answer's (judged, good) IMA entries show."""
        host = self._hosts.get(round_.host)
        if host is None or not isinstance(answer, dict):
            return None
        try:
            parsed = QuoteAnswer.from_dict(answer)
            if parsed.ima is None:
                return None
            return proven_file_digest(ima_evidence(parsed.ima).entries, host[1])
        except MalformedError:  # judged good: cannot happen; proves nothing
            return None
