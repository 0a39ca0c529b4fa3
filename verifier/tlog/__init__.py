"""The attestation log's shell (issue 30): entries staged with the state
changes they record (:mod:`.staging`), a sequencer that appends them to
the Merkle tree kept in the database and signs checkpoints
(:mod:`.sequencer`), retention, and the reads behind the API
(:mod:`.reads`). The tree, proofs and checkpoints are the pure core's
(:mod:`verifier.protocol.translog`)."""

from verifier.tlog.staging import (
    ATTESTED,
    FAILED,
    HOST_UNTRUSTED,
    POLICY_CHANGED,
    RECOVERED,
    REVOKED,
    UNREACHABLE,
    Staged,
    log_values,
    stage,
    stage_note,
)

__all__ = [
    "ATTESTED",
    "FAILED",
    "HOST_UNTRUSTED",
    "POLICY_CHANGED",
    "RECOVERED",
    "REVOKED",
    "UNREACHABLE",
    "Staged",
    "log_values",
    "stage",
    "stage_note",
]
