"""Runtime evidence that comes with a quote: the IMA measurement list and
the UEFI (measured-boot) event log, checked against the quoted PCRs.

A node answers a quote request with, besides the quote, the IMA entries
from the index the verifier asked for (``ima``) and, when asked, its whole
firmware event log (``mb_log``); their wire forms are
:mod:`verifier.protocol.messages.quote`'s (:class:`ImaPart`, the
answer's ``mb_log`` bytes). Here their content is parsed and judged.

The checks here are pure: the caller keeps the per-node
:class:`~verifier.protocol.ima.ReplayState` between quotes and the shared
policy objects, and acts on the :class:`EvidenceError` raised (its
``reason`` and ``detail`` name the failed entry or event).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from verifier.protocol.errors import EvidenceError
from verifier.protocol.ima import (
    ImaEntry,
    ReplayState,
    RuntimePolicy,
    check_boot_aggregate,
    parse_ascii,
    parse_binary,
    replay,
    replay_to_pcr,
)
from verifier.protocol.ima import check as check_runtime_policy
from verifier.protocol.ima.log import IMA_PCR
from verifier.protocol.ima.replay import SHA1_BOOT_PCRS
from verifier.protocol.mb import MeasuredBootPolicy, check_against_pcrs, parse
from verifier.protocol.mb import check as check_mb_policy
from verifier.protocol.mb import replay as replay_boot
from verifier.protocol.mb.eventlog import LEGACY_SHA1
from verifier.protocol.messages.quote import (
    MAX_IMA_BYTES,
    MAX_MB_LOG_BYTES,
    ImaPart,
    mb_log_from_wire,
)

__all__ = [
    "BOOT_PCRS",
    "MAX_IMA_BYTES",
    "MOK_PCR",
    "MAX_MB_LOG_BYTES",
    "ImaEvidence",
    "check_ima",
    "check_measured_boot",
    "extend_ima",
    "ima_evidence",
    "is_legacy_log",
    "parse_ima_evidence",
    "parse_mb_log",
]

#: The PCRs a measured-boot log replays into (and boot_aggregate covers).
BOOT_PCRS = tuple(range(10))
#: shim's MOK lists: quoted and replayed too when a policy checks them.
MOK_PCR = 14


class ImaEvidence:
    """IMA entries a node sent, starting at list index :attr:`first`;
    :attr:`more` when the node stopped early (the rest comes next)."""

    __slots__ = ("entries", "first", "more")

    def __init__(
        self, first: int, entries: Sequence[ImaEntry], more: bool = False
    ) -> None:
        self.first = first
        self.entries = entries
        self.more = more


def ima_evidence(part: ImaPart) -> ImaEvidence:
    """Parse the entries of an answer's (already validated) IMA part.

    Raises:
        MalformedError: naming the entry that does not parse (truncated,
            unknown template, ...).
    """
    if isinstance(part.entries, bytes):
        entries = parse_binary(part.entries, part.first)
    else:
        entries = parse_ascii(part.entries, part.first)
    return ImaEvidence(part.first, entries, part.more)


def parse_ima_evidence(data: object) -> ImaEvidence:
    """Parse the ``ima`` object of a quote answer and its entries.

    Raises:
        MalformedError: naming the bad field, or the entry that does not
            parse (truncated, unknown template, ...).
    """
    return ima_evidence(ImaPart.from_dict(data))


def parse_mb_log(text: object) -> bytes:
    """Decode the ``mb_log`` field of a quote answer.

    Raises:
        MalformedError: not base64 or too large.
    """
    return mb_log_from_wire(text)


def _check_start(state: ReplayState, evidence: ImaEvidence) -> None:
    if evidence.first != state.count:
        raise EvidenceError(
            "ima_log_gap",
            f"entries start at {evidence.first}, expected {state.count}",
        )


def extend_ima(
    state: ReplayState, evidence: ImaEvidence, policy: RuntimePolicy | None
) -> ReplayState:
    """Consume a part of a long list that the node sent in pieces
    (``more``): replay and judge it; the quote that comes with the last
    piece must match the replay of all of them (:func:`check_ima`), so
    nothing is accepted on these entries' word alone.

    Raises:
        EvidenceError: as :func:`check_ima` (but no PCR comparison).
    """
    _check_start(state, evidence)
    new = replay(state, evidence.entries)
    if policy is not None and evidence.entries:
        check_runtime_policy(policy, evidence.entries, state.count)
    return new


def check_ima(
    state: ReplayState,
    evidence: ImaEvidence,
    pcr_values: Mapping[int, bytes],
    policy: RuntimePolicy | None,
    first_entry: ImaEntry | None = None,
    bank_values: Mapping[str, Mapping[int, bytes]] | None = None,
) -> ReplayState:
    """Replay the new IMA entries up to the quoted PCR 10 and judge them.

    Only the entries the quote covers are consumed (the list is read after
    the quote, so it may run ahead); the rest come again next round. When
    entry 0 is consumed and its bank's boot PCRs were quoted,
    ``boot_aggregate`` must match them: a sha1 aggregate the sha1 bank's
    PCRs 0-7 (when the quote covers that bank), any other the sha256 bank's
    PCRs 0-9.

    Args:
        state: what earlier quotes of this boot verified.
        evidence: the entries the node sent.
        pcr_values: the verified, quoted sha256 PCR values (must hold 10).
        policy: the runtime policy, or None to check the log only.
        first_entry: entry 0 when an earlier part of this list consumed it
            (:func:`extend_ima`) before any quote could check it: its
            ``boot_aggregate`` is checked against this quote's PCRs 0-9.
        bank_values: the verified values of the other banks quoted
            (``{"sha1": {...}}``).

    Returns:
        The new state to keep for the next quote.

    Raises:
        EvidenceError: ``ima_log_gap`` (entries do not start where the last
            quote ended), ``ima_pcr_mismatch`` (no prefix replays to the
            quoted PCR 10), ``ima_template_hash``, ``ima_boot_aggregate``,
            or ``ima_policy`` naming the first refused entry.
    """
    _check_start(state, evidence)
    quoted = pcr_values.get(IMA_PCR)
    if quoted is None:
        raise EvidenceError("pcr_selection", "PCR 10 was not quoted")
    new = replay_to_pcr(state, evidence.entries, quoted)
    covered = evidence.entries[: new.count - state.count]
    entry0 = covered[0] if state.count == 0 and covered else first_entry
    sha1 = (bank_values or {}).get("sha1", {})
    if entry0 is not None and entry0.digest_algorithm == "sha1" and sha1:
        if all(i in sha1 for i in SHA1_BOOT_PCRS):
            check_boot_aggregate(entry0, [sha1[i] for i in SHA1_BOOT_PCRS], "sha1")
    elif entry0 is not None and all(i in pcr_values for i in BOOT_PCRS):
        check_boot_aggregate(entry0, [pcr_values[i] for i in BOOT_PCRS])
    if policy is not None and covered:
        check_runtime_policy(policy, covered, state.count)
    return new


def is_legacy_log(log: bytes) -> bool:
    """Whether ``log`` is a legacy SHA-1 log, judged against the sha1 bank.

    Raises:
        MalformedError: the log does not parse.
    """
    return parse(log).format == LEGACY_SHA1


def check_measured_boot(
    log: bytes,
    pcr_values: Mapping[int, bytes],
    policy: MeasuredBootPolicy | None,
    bank_values: Mapping[str, Mapping[int, bytes]] | None = None,
) -> None:
    """Replay the firmware event log into PCRs 0-9 and judge it.

    Every quoted PCR among 0-9 (and 14, shim's MOK lists, when quoted)
    must equal the log's replay: in the sha256 bank for a crypto-agile log,
    in the sha1 bank for a legacy SHA-1 log (its events carry SHA-1 digests
    only), which the quote must then cover (``bank_values``). Without a
    sha1 quote a legacy log is judged against the sha256 bank only when it
    extends nothing (e.g. a lone ``StartupLocality`` event).

    Args:
        log: the binary event log.
        pcr_values: the verified, quoted sha256 PCR values.
        policy: the measured-boot policy, or None to check the replay only.
        bank_values: the verified values of the other banks quoted
            (``{"sha1": {...}}``).

    Raises:
        MalformedError: the log does not parse (naming the format seen, the
            event and the field).
        EvidenceError: ``mb_pcr_mismatch`` naming the PCR (and the bank),
            ``mb_missing_digest`` (naming the format of a legacy log), or
            ``mb_policy`` naming the events the policy refuses.
    """
    parsed = parse(log)
    events = parsed.events
    sha1 = (bank_values or {}).get("sha1", {})
    if parsed.format == LEGACY_SHA1 and sha1:
        bank, values = "sha1", sha1
    else:
        bank, values = "sha256", pcr_values
    pcrs = (*BOOT_PCRS, MOK_PCR) if MOK_PCR in values else BOOT_PCRS
    quoted = {i: v for i, v in values.items() if i in pcrs}
    if not any(i in BOOT_PCRS for i in quoted):
        raise EvidenceError("pcr_selection", "no PCR among 0-9 was quoted")
    if policy is not None and policy.chain is not None and policy.chain.mok:
        if MOK_PCR not in quoted:
            raise EvidenceError(
                "pcr_selection",
                f"the policy checks shim's MOK lists: PCR {MOK_PCR} must be quoted",
            )
    try:
        replayed = replay_boot(events, (bank,), pcrs)[bank]
    except EvidenceError as exc:
        if parsed.format != LEGACY_SHA1:
            raise
        raise EvidenceError(
            exc.reason,
            f"{exc.detail}: a {LEGACY_SHA1} log (no Spec ID Event03) has SHA-1 "
            "digests only, and the quote covers the sha256 bank only (the node's "
            "TPM has no active sha1 bank, or its agent does not quote it)",
        ) from None
    try:
        check_against_pcrs(replayed, quoted)
    except EvidenceError as exc:
        if bank == "sha256":
            raise
        raise EvidenceError(exc.reason, f"sha1 bank: {exc.detail}") from None
    if policy is not None:
        check_mb_policy(policy, events)
