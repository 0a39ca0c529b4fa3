"""Fuzz targets of the batched deep quote's core (issue 29 item 5): a host
round's JSON and a guest's batch proof JSON, each checked with
:func:`verifier.protocol.hostbatch.verify_guest_in_batch` against a good
counterpart (host quote from the soft TPM)."""

from __future__ import annotations

import functools
import hashlib
import uuid

from trusted_testing.fuzz_common import Target
from trusted_testing.fuzz_common import dump_json as _dump
from trusted_testing.fuzz_common import load_json as _json
from verifier.protocol import hostbatch
from verifier.protocol.quote import bind_nonce

__all__ = ["hostbatch_targets"]

_HOST = str(uuid.UUID(int=0x4057))
_AT = 1000.0


def _guest(i: int) -> tuple[str, bytes]:
    return str(uuid.UUID(int=0x6000 + i)), b"guest attest %d" % i


@functools.lru_cache(maxsize=1)
def _round() -> tuple[hostbatch.HostRound, hostbatch.GuestBatch]:
    """A host round over a 5-guest batch, its quote from a soft TPM."""
    from trusted_testing.softtpm import SoftTpm

    tpm = SoftTpm(ak_alg="ecc", ek_alg="ecc")
    tpm.extend(16, hashlib.sha256(b"host boot").digest())
    batch = hostbatch.GuestBatch([hostbatch.guest_leaf(*_guest(i)) for i in range(5)])
    fresh = bytes(range(20))
    nonce = hostbatch.host_nonce(fresh, batch.root, batch.size)
    nk = bytes(range(32))  # the agent binds its NK public key after the nonce
    quote = tpm.quote(bind_nonce(nonce, nk), (16,))
    host_round = hostbatch.HostRound(
        _HOST, fresh, batch.root, batch.size, quote.attest, _AT, True, (nk,)
    )
    return host_round, batch


def _check(host_round: hostbatch.HostRound, proof: hostbatch.BatchProof) -> None:
    index = proof.index if proof.index < 5 else 0
    instance, attest = _guest(index)
    hostbatch.verify_guest_in_batch(
        host_round,
        host_uuid=_HOST,
        instance_uuid=instance,
        vtpm_attest=attest,
        proof=proof,
        now=_AT + 1,
        max_age=30.0,
    )


def _host_round(data: bytes) -> object:
    host_round = hostbatch.HostRound.from_dict(_json(data))
    _check(host_round, _round()[1].proof(2))
    return host_round


def _batch_proof(data: bytes) -> object:
    proof = hostbatch.BatchProof.from_dict(_json(data))
    _check(_round()[0], proof)
    return proof


def hostbatch_targets() -> list[Target]:
    """The targets of this module."""
    return [
        Target("host_round", _host_round, lambda: [_dump(_round()[0].to_dict())]),
        Target(
            "batch_proof",
            _batch_proof,
            lambda: [_dump(_round()[1].proof(i).to_dict()) for i in range(5)],
        ),
    ]
