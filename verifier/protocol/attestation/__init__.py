"""The verifier's attestation of one node, as a pure state machine
(architecture flows 3, 4 and 5: bootstrap, continuous attestation,
revocation).

One :class:`NodeAttestation` per node holds everything the verifier judges
with: the node's AK, its PCR, runtime (IMA) and measured-boot policies,
the TPM clock of its last accepted quote, the IMA replay state, and where
it is in its life::

    registered --good first quote--> bootstrapping --V delivered--> attested
    registered, enrolled without V (a compute host) --good quote--> attested
    (any but revoked) --unreachable N rounds--> unreachable (or revoked)
    (any but revoked) --a round that broke--> failed
    unreachable or failed --good quote--> bootstrapping or attested
    unreachable --silent for unreachable_timeout--> revoked
    (any) --bad or malformed evidence, incomplete evidence, refused CSR,
            the tenant--> revoked (final)

(``pending`` and ``created`` come before: the node waits for its instance
and its agent, :mod:`verifier.attest.pending`, and is not judged yet.)

It is driven by inputs -- :meth:`~NodeAttestation.judge` an answer to the
:class:`~verifier.protocol.messages.quote.QuoteRequest` it made
(:meth:`~NodeAttestation.request`), :meth:`~NodeAttestation.transport_failed`,
:meth:`~NodeAttestation.v_delivered`, :meth:`~NodeAttestation.revoke` -- and
answers each with a :class:`Verdict`: the next :class:`Action` and the
:class:`Transition` to persist. Like TUF's ``TrustedMetadataSet`` it does
no I/O, reads no clock (``now`` is given) and no configuration (the
:class:`AttestationRules` are given).

State changes are write-ahead: a transition changes the node only when the
caller :meth:`~NodeAttestation.apply` s it, after writing it (a revocation
with its signed event, in one transaction). The hot state (clock, IMA
replay, counters) changes at once and sets :attr:`~NodeAttestation.dirty`
for the caller to write behind (:meth:`~NodeAttestation.snapshot`).

A candidate runtime policy is tried on a node's whole current IMA list by
a :class:`PolicyDryRun`, which holds nothing of the node's state and
changes none of it (the dry run before publishing a version).

Judging fails closed: :meth:`~NodeAttestation.judge` never raises; an
answer that does not parse, evidence that fails, and any unexpected error
while judging all end in a revocation naming the reason.
"""

from verifier.protocol.attestation.dryrun import PolicyDryRun
from verifier.protocol.attestation.machine import NodeAttestation
from verifier.protocol.attestation.verdict import (
    Action,
    AttestationMode,
    AttestationRules,
    HotState,
    NodeState,
    Transition,
    Verdict,
)

__all__ = [
    "Action",
    "AttestationMode",
    "AttestationRules",
    "HotState",
    "NodeAttestation",
    "NodeState",
    "PolicyDryRun",
    "Transition",
    "Verdict",
]
