"""Replay of a measured-boot event log into PCR values.

Every event extended into a PCR (:attr:`~verifier.protocol.mb.eventlog.Event.extended`:
not ``EV_NO_ACTION``, not PCRIndex ``0xFFFFFFFF``) extends its logged digest
into its PCR, ``pcr = H(pcr || digest)``, per bank, from all-zero PCRs but
PCR 0, whose start value says how the TPM was started (TPM 2.0 Library
Part 1, "PCR initialization", and the reference code's ``PCRStartup`` and
``PcrDrtm``; TCG PC Client Platform Firmware Profile, section 10.4.5.3):

* ``TPM2_Startup`` from locality 0: all zeros;
* ``TPM2_Startup`` from locality 3: ``00..03``. The firmware logs a
  ``StartupLocality`` ``EV_NO_ACTION`` event in PCR 0
  (``"StartupLocality\\0"`` and one locality byte);
* an H-CRTM (a measurement sent by ``_TPM_Hash_Start/Data/End`` before
  ``TPM2_Startup``): the TPM resets PCR 0 to ``00..04`` and extends the
  H-CRTM digest into it; ``TPM2_Startup`` then leaves PCR 0 alone. The
  firmware logs that digest as an ``EV_EFI_HCRTM_EVENT`` in PCR 0 (the
  first measurement of PCR 0), and may log ``StartupLocality`` with
  locality 4.

:func:`startup_locality` reads that from the log and refuses a log that
contradicts itself (two StartupLocality events, a locality other than 0, 3
or 4, locality 0 or 3 with an H-CRTM event, an H-CRTM event that is not
PCR 0's first measurement).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping

from verifier.protocol.errors import EvidenceError, MalformedError
from verifier.protocol.mb.eventlog import (
    EV_EFI_HCRTM_EVENT,
    EV_NO_ACTION,
    HASHLIB_NAMES,
    Event,
)

__all__ = [
    "DEFAULT_PCRS",
    "HCRTM_LOCALITY",
    "STARTUP_LOCALITY",
    "check_against_pcrs",
    "replay",
    "startup_locality",
]

#: The PCRs the firmware and boot loader measure into.
DEFAULT_PCRS = frozenset(range(10))
STARTUP_LOCALITY = b"StartupLocality\x00"
#: The PCR 0 locality indicator after an H-CRTM sequence.
HCRTM_LOCALITY = 4
_LOCALITIES = (0, 3, HCRTM_LOCALITY)
_HASHES = ("sha1", "sha256", "sha384", "sha512", "sm3_256")


def _fault(event: Event, field: str, problem: str) -> MalformedError:
    return MalformedError(
        "TCG event log", f"event {event.index} ({event.type_name}): {field}: {problem}"
    )


def startup_locality(events: Iterable[Event]) -> int:
    """The locality indicator PCR 0 starts from: 0, 3 or 4 (H-CRTM).

    Raises:
        MalformedError: naming the event and field, for a StartupLocality
            event that is not 17 bytes or not in PCR 0, a locality other
            than 0, 3 or 4, a second StartupLocality event, a StartupLocality
            of 0 or 3 with an H-CRTM event, or an H-CRTM event that is not
            in PCR 0 or not PCR 0's first measurement.
    """
    declared: Event | None = None
    locality = 0
    hcrtm: Event | None = None
    first_pcr0: Event | None = None
    for event in events:
        if event.event_type == EV_NO_ACTION and event.data.startswith(STARTUP_LOCALITY):
            if len(event.data) != len(STARTUP_LOCALITY) + 1:
                raise _fault(
                    event,
                    "StartupLocality",
                    f"{len(event.data)} bytes, the event is 17: the signature "
                    "and one locality byte",
                )
            if event.pcr != 0:
                raise _fault(event, "PCRIndex", f"{event.pcr:#x}, StartupLocality is 0")
            if declared is not None:
                raise _fault(
                    event,
                    "StartupLocality",
                    f"a second StartupLocality event (the first is event "
                    f"{declared.index})",
                )
            declared, locality = event, event.data[-1]
            if locality not in _LOCALITIES:
                raise _fault(
                    event, "StartupLocality", f"locality {locality} is not 0, 3 or 4"
                )
        elif event.event_type == EV_EFI_HCRTM_EVENT:
            if event.pcr != 0:
                raise _fault(event, "PCRIndex", f"{event.pcr:#x}, the H-CRTM is PCR 0")
            if first_pcr0 is not None:
                raise _fault(
                    event,
                    "EventType",
                    "the H-CRTM measurement is PCR 0's first, but event "
                    f"{first_pcr0.index} extended PCR 0 before it",
                )
            hcrtm = event
        if first_pcr0 is None and event.pcr == 0 and event.extended:
            first_pcr0 = event
    if hcrtm is not None:
        if declared is not None and locality != HCRTM_LOCALITY:
            raise _fault(
                declared,
                "StartupLocality",
                f"locality {locality}, but event {hcrtm.index} is an H-CRTM "
                "measurement (PCR 0 starts at locality 4)",
            )
        return HCRTM_LOCALITY
    return locality


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
        MalformedError: PCR 0's start is contradictory
            (:func:`startup_locality`).
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
            if not event.extended or event.pcr not in wanted:
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
