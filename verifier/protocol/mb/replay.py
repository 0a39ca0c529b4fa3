"""Replay of a measured-boot event log into PCR values.

Every event but ``EV_NO_ACTION`` extends its logged digest into its PCR,
``pcr = H(pcr || digest)``, per bank, from all-zero PCRs. A
``StartupLocality`` ``EV_NO_ACTION`` event in PCR 0 (TCG PC Client Platform
Firmware Profile, section 10.4.5.3: ``"StartupLocality\\0"`` followed by one
locality byte) records that the TPM was started from locality 3 or 4 (H-CRTM);
PCR 0 then starts as ``00..00 || locality``.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping

from verifier.protocol.errors import EvidenceError
from verifier.protocol.mb.eventlog import EV_NO_ACTION, HASHLIB_NAMES, Event

__all__ = [
    "DEFAULT_PCRS",
    "STARTUP_LOCALITY",
    "check_against_pcrs",
    "replay",
    "startup_locality",
]

#: The PCRs the firmware and boot loader measure into.
DEFAULT_PCRS = frozenset(range(10))
STARTUP_LOCALITY = b"StartupLocality\x00"
_HASHES = ("sha1", "sha256", "sha384", "sha512", "sm3_256")


def startup_locality(events: Iterable[Event]) -> int:
    """The locality from a ``StartupLocality`` event in PCR 0, else 0."""
    for event in events:
        if (
            event.event_type == EV_NO_ACTION
            and event.pcr == 0
            and len(event.data) == len(STARTUP_LOCALITY) + 1
            and event.data.startswith(STARTUP_LOCALITY)
        ):
            return event.data[-1]
    return 0


def replay(
    events: Iterable[Event],
    banks: Iterable[str] = ("sha1", "sha256"),
    pcrs: Iterable[int] = DEFAULT_PCRS,
) -> dict[str, dict[int, bytes]]:
    """Replay ``events`` into PCR values.

    Args:
        events: the parsed log (e.g. ``EventLog.events``).
        banks: the banks to compute (``sha1``, ``sha256``, ``sha384``,
            ``sha512``, ``sm3_256``: the TCG's names).
        pcrs: the PCRs to compute; events in other PCRs are skipped.

    Returns:
        bank -> PCR index -> value, for every PCR of ``pcrs`` extended at
        least once (PCR 0 also when a startup locality is recorded).

    Raises:
        EvidenceError: ``mb_missing_digest`` when an extending event lacks
            a digest of a requested bank (or it has the wrong size).
    """
    events = tuple(events)
    wanted = frozenset(pcrs)
    names = tuple(banks)
    for name in names:
        if name not in _HASHES:
            raise ValueError(f"unsupported bank {name!r}")
    locality = startup_locality(events)
    out: dict[str, dict[int, bytes]] = {}
    for name in names:
        algorithm = HASHLIB_NAMES.get(name, name)
        size = hashlib.new(algorithm).digest_size
        values: dict[int, bytes] = {}
        if locality and 0 in wanted:
            values[0] = bytes(size - 1) + bytes([locality])
        for event in events:
            if event.event_type == EV_NO_ACTION or event.pcr not in wanted:
                continue
            digest = event.digests.get(name)
            if digest is None or len(digest) != size:
                raise EvidenceError(
                    "mb_missing_digest",
                    f"event {event.index} ({event.type_name}) has no {name} digest",
                )
            old = values.get(event.pcr, bytes(size))
            values[event.pcr] = hashlib.new(algorithm, old + digest).digest()
        out[name] = values
    return out


def check_against_pcrs(
    replayed: Mapping[int, bytes], quoted: Mapping[int, bytes]
) -> None:
    """Compare one bank's replay with quoted PCR values.

    Every PCR of ``quoted`` must equal the replayed value (a PCR the log
    never extended must be all zeros).

    Raises:
        EvidenceError: ``mb_pcr_mismatch`` naming the first differing PCR.
    """
    for pcr in sorted(quoted):
        want = quoted[pcr]
        got = replayed.get(pcr, bytes(len(want)))
        if not hmac.compare_digest(got, want):
            raise EvidenceError(
                "mb_pcr_mismatch",
                f"PCR {pcr}: log replays to {got.hex()}, quote has {want.hex()}",
            )
