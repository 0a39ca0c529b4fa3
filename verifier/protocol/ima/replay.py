"""Incremental replay of the IMA measurement list into PCR 10.

For each entry the kernel extends every active PCR bank with the bank's hash
of the template data (``ima_calc_field_array_hash``); a violation is logged
with an all-zero template hash and extends all-0xFF of the bank's digest
size. Replay recomputes both the SHA-1 and the SHA-256 bank from the
template data and never trusts the logged template hash; it only checks that
the logged SHA-1 hash equals SHA-1(template data) for non-violations.

:class:`ReplayState` is what a verifier keeps per node between quotes:
:func:`replay` consumes only the new entries.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
from collections.abc import Sequence

from verifier.protocol.errors import EvidenceError
from verifier.protocol.ima.log import IMA_PCR, ImaEntry

__all__ = [
    "BOOT_AGGREGATE",
    "BOOT_PCRS",
    "SHA1_BOOT_PCRS",
    "ReplayState",
    "boot_aggregate",
    "boot_aggregate_pcrs",
    "check_against_pcr",
    "check_boot_aggregate",
    "replay",
    "replay_to_pcr",
]

BOOT_AGGREGATE = "boot_aggregate"
_ZERO20 = bytes(20)
_FF20 = b"\xff" * 20
_FF32 = b"\xff" * 32
_sha1 = hashlib.sha1
_sha256 = hashlib.sha256


@dataclasses.dataclass(frozen=True, slots=True)
class ReplayState:
    """PCR 10 after replaying the first ``count`` entries.

    Attributes:
        count: entries consumed so far (the index of the next entry).
        sha1: the SHA-1 bank's PCR 10.
        sha256: the SHA-256 bank's PCR 10.
    """

    count: int = 0
    sha1: bytes = bytes(20)
    sha256: bytes = bytes(32)


def _fail_hash(index: int) -> EvidenceError:
    return EvidenceError(
        "ima_template_hash",
        f"entry {index}: logged template hash is not SHA-1 of the template data",
    )


def _check_entry(entry: ImaEntry, index: int) -> None:
    if entry.pcr != IMA_PCR:
        raise EvidenceError(
            "ima_unexpected_pcr", f"entry {index}: PCR {entry.pcr}, expected 10"
        )
    if index == 0 and entry.path != BOOT_AGGREGATE:
        raise EvidenceError("ima_boot_aggregate", "entry 0 is not boot_aggregate")


def _replay(
    state: ReplayState, entries: Sequence[ImaEntry], target: bytes | None
) -> ReplayState:
    a1 = state.sha1
    a256 = state.sha256
    index = state.count
    if target is not None and hmac.compare_digest(a256, target):
        return state
    for entry in entries:
        if index == 0 or entry.pcr != IMA_PCR:
            _check_entry(entry, index)
        thash = entry.template_hash
        if thash == _ZERO20:
            a1 = _sha1(a1 + _FF20).digest()
            a256 = _sha256(a256 + _FF32).digest()
        else:
            data = entry.template_data
            d1 = _sha1(data).digest()
            if d1 != thash:
                raise _fail_hash(index)
            a1 = _sha1(a1 + d1).digest()
            a256 = _sha256(a256 + _sha256(data).digest()).digest()
        index += 1
        if target is not None and a256 == target:
            return ReplayState(index, a1, a256)
    if target is not None:
        raise EvidenceError(
            "ima_pcr_mismatch",
            f"no prefix of entries {state.count}..{index - 1} replays to the "
            "quoted PCR 10",
        )
    return ReplayState(index, a1, a256)


def replay(state: ReplayState, entries: Sequence[ImaEntry]) -> ReplayState:
    """Extend ``state`` with ``entries`` (the entries from ``state.count`` on).

    Raises:
        EvidenceError: ``ima_template_hash`` when a logged template hash is
            not SHA-1 of its data, ``ima_unexpected_pcr`` for an entry not
            for PCR 10, ``ima_boot_aggregate`` when entry 0 is not
            ``boot_aggregate``.
    """
    return _replay(state, entries, None)


def replay_to_pcr(
    state: ReplayState, entries: Sequence[ImaEntry], quoted_sha256: bytes
) -> ReplayState:
    """Replay the shortest prefix of ``entries`` that reaches the quote.

    The list is read after the quote, so it may hold entries the quote does
    not cover yet; those are left for the next round (``count`` tells the
    caller where to resume).

    Raises:
        EvidenceError: as :func:`replay`, or ``ima_pcr_mismatch`` when no
            prefix matches ``quoted_sha256``.
    """
    return _replay(state, entries, quoted_sha256)


def check_against_pcr(state: ReplayState, quoted_pcr10_sha256: bytes) -> None:
    """Require the replayed SHA-256 PCR 10 to equal the quoted one.

    Raises:
        EvidenceError: ``ima_pcr_mismatch``.
    """
    if not hmac.compare_digest(state.sha256, quoted_pcr10_sha256):
        raise EvidenceError(
            "ima_pcr_mismatch",
            f"replay of {state.count} entries gives {state.sha256.hex()}, "
            f"quoted PCR 10 is {quoted_pcr10_sha256.hex()}",
        )


#: The PCRs the boot aggregate covers, by its algorithm: the kernel's
#: ``ima_calc_boot_aggregate_tfm`` hashes PCRs 0-7 of the bank, and PCRs 8-9
#: as well only for a bank other than sha1 (Linux 5.8 on; a sha1 aggregate
#: over 0-7 keeps one value for a boot across kernels before and after).
SHA1_BOOT_PCRS = tuple(range(8))
BOOT_PCRS = tuple(range(10))


def boot_aggregate_pcrs(algorithm: str) -> tuple[int, ...]:
    """The PCRs a boot aggregate of ``algorithm`` covers: 0-7 for sha1, 0-9
    for any other bank."""
    return SHA1_BOOT_PCRS if algorithm == "sha1" else BOOT_PCRS


def boot_aggregate(pcrs: Sequence[bytes], algorithm: str = "sha256") -> bytes:
    """The boot aggregate of one bank, as the kernel computes it.

    Args:
        pcrs: the bank's PCR 0..9 values in order (PCR 0..7 suffice for
            sha1, whose aggregate covers only those).
        algorithm: the bank's (and the entry's digest) algorithm.
    """
    covered = boot_aggregate_pcrs(algorithm)
    if len(pcrs) not in (len(covered), len(BOOT_PCRS)):
        raise ValueError(f"a {algorithm} boot_aggregate covers PCRs 0-{covered[-1]}")
    return hashlib.new(algorithm, b"".join(pcrs[: len(covered)])).digest()


def check_boot_aggregate(
    entry: ImaEntry, pcrs: Sequence[bytes], bank: str = "sha256"
) -> None:
    """Require ``entry`` to be the boot aggregate of the quoted PCRs.

    Args:
        entry: IMA entry 0.
        pcrs: the quoted PCR 0..9 values of ``bank``.
        bank: the bank ``pcrs`` come from; it must be the entry's
            algorithm (a sha1 aggregate is over the sha1 bank's PCRs 0-7).

    Raises:
        EvidenceError: ``ima_boot_aggregate`` naming the algorithm and the
            PCRs, or the bank that would have to be quoted.
    """
    algorithm = entry.digest_algorithm
    covered = boot_aggregate_pcrs(algorithm)
    span = f"PCRs 0-{covered[-1]}"
    if entry.path != BOOT_AGGREGATE:
        raise EvidenceError("ima_boot_aggregate", "entry 0 is not boot_aggregate")
    if algorithm != bank:
        raise EvidenceError(
            "ima_boot_aggregate",
            f"boot_aggregate is {algorithm} (over the {algorithm} bank's {span}), "
            f"the quote covers the {bank} bank",
        )
    if not hmac.compare_digest(entry.digest, boot_aggregate(pcrs, algorithm)):
        raise EvidenceError(
            "ima_boot_aggregate",
            f"{algorithm} boot_aggregate does not match the quoted {span}",
        )
