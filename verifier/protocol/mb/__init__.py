"""Measured boot: the TCG crypto-agile boot event log, its replay into
PCRs 0-9 and measured-boot policies (firmware and boot application digests,
Secure Boot state).

Pure and I/O-free like the rest of :mod:`verifier.protocol`.
"""

from verifier.protocol.mb.eventlog import (
    EfiVariable,
    Event,
    EventLog,
    SpecIdEvent,
    event_type_name,
    parse,
    parse_efi_variable,
)
from verifier.protocol.mb.policy import (
    Failure,
    MeasuredBootPolicy,
    check,
    evaluate,
    secure_boot_state,
)
from verifier.protocol.mb.replay import check_against_pcrs, replay, startup_locality

__all__ = [
    "EfiVariable",
    "Event",
    "EventLog",
    "Failure",
    "MeasuredBootPolicy",
    "SpecIdEvent",
    "check",
    "check_against_pcrs",
    "evaluate",
    "event_type_name",
    "parse",
    "parse_efi_variable",
    "replay",
    "secure_boot_state",
    "startup_locality",
]
