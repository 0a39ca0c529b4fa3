"""The attestation log's pure core: RFC 9162 (Certificate Transparency v2)
section 2.1 Merkle tree hashing and proofs; C2SP signed-note and
tlog-checkpoint formats; a node's history and its offline check.

* :mod:`~verifier.protocol.translog.tree` -- the tree, a :class:`Frontier`
  that appends leaves and names the nodes a store keeps, inclusion and
  consistency proofs built from stored nodes and verified (RFC 9162 2.1);
* :mod:`~verifier.protocol.translog.checkpoint` -- checkpoints signed as C2SP
  notes with the verifier's Ed25519 event key;
* :mod:`~verifier.protocol.translog.history` -- log entries, a node's chained
  history proved against a checkpoint, and a checkpoint extending another.

Pure: no I/O and no clock; the store is reached through a
:data:`NodeGetter` the caller passes.
"""

from verifier.protocol.translog.checkpoint import (
    MAX_NOTE_BYTES,
    MAX_SIGNATURES,
    ORIGIN_PREFIX,
    Checkpoint,
    key_hash,
    log_origin,
    open_checkpoint,
    sign_checkpoint,
    verifier_key,
)
from verifier.protocol.translog.history import (
    MAX_DETAIL,
    MAX_ENTRY_BYTES,
    MAX_TEXT,
    EntryKind,
    HistoryProof,
    LogEntry,
    verify_extension,
    verify_history,
)
from verifier.protocol.translog.tree import (
    EMPTY_ROOT,
    HASH_SIZE,
    MAX_SIZE,
    Frontier,
    LogProofError,
    NodeGetter,
    consistency_proof,
    inclusion_proof,
    leaf_hash,
    node_hash,
    root_from_leaves,
    subtree_root,
    verify_consistency,
    verify_inclusion,
)

__all__ = [
    "EMPTY_ROOT",
    "HASH_SIZE",
    "MAX_DETAIL",
    "MAX_ENTRY_BYTES",
    "MAX_NOTE_BYTES",
    "MAX_SIGNATURES",
    "MAX_SIZE",
    "MAX_TEXT",
    "ORIGIN_PREFIX",
    "Checkpoint",
    "EntryKind",
    "Frontier",
    "HistoryProof",
    "LogEntry",
    "LogProofError",
    "NodeGetter",
    "consistency_proof",
    "inclusion_proof",
    "key_hash",
    "leaf_hash",
    "log_origin",
    "node_hash",
    "open_checkpoint",
    "root_from_leaves",
    "sign_checkpoint",
    "subtree_root",
    "verifier_key",
    "verify_consistency",
    "verify_extension",
    "verify_history",
    "verify_inclusion",
]
