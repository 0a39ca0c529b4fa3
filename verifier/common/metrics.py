"""Prometheus metrics of every trusted-cloud service (issue 30, the
operators' view; doc/source/admin/monitoring.rst).

Every metric is declared here, in one :class:`CollectorRegistry` of the
process (:data:`REGISTRY`, not the client's global default, so nothing
registered by a library leaks in). Names follow Prometheus's guide: the
``trusted_cloud_`` prefix, ``_total`` counters, base units (``_seconds``).

Labels are bounded sets and never name a node or a project: at 100,000
nodes a per-node series would cost the Prometheus server more than the
verifier, and a per-project one would tell a scraper which projects
exist. A failure ``reason`` is one of the verifier's stable codes
(:data:`REASONS`); anything else (a reason an operator typed when revoking
on request, a code added later and not listed here) is counted as
``other``, so no free text ever becomes a label value.

Code elsewhere calls the small helpers below, one call at the place where
the thing happens; gauges of a service's live state are set by its
``/metrics`` handler just before it renders the registry.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)

if TYPE_CHECKING:
    from verifier.protocol.attestation import Verdict

__all__ = [
    "ACTIVATIONS",
    "ATTESTATIONS",
    "HOOK_ACTIONS",
    "HOOK_DEAD_LETTERS",
    "KEY_RELEASES",
    "NODES",
    "NODE_TRANSITIONS",
    "OUTBOX_DEPTH",
    "OUTBOX_OLDEST_AGE",
    "LOG_ENTRIES",
    "LOG_UNSEQUENCED",
    "LOG_OLDEST_UNSEQUENCED_AGE",
    "POLICIES_IN_FORCE",
    "PUSH_SESSIONS",
    "QUOTE_LAG",
    "QUOTE_ROUND",
    "REASONS",
    "REGISTRATIONS",
    "REGISTRY",
    "attestation",
    "counted",
    "judged",
    "push_session",
    "dead_letter",
    "hook_action",
    "reason_label",
    "transition",
]

#: The registry every metric of this process is in (``/metrics`` renders it).
REGISTRY = CollectorRegistry()
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)

#: The stable failure codes of the verifier (EvidenceError reasons of the
#: core and the service's own); any other reason is counted as ``other``.
REASONS = frozenset(
    {
        "ak_not_activated", "ak_template", "check_error", "clock_rollback",
        "csr", "deep_quote_binding", "ek_certificate", "ek_certificate_missing",
        "ek_certificate_no_instance", "ek_certificate_other_host",
        "ek_certificate_other_instance", "ek_template", "event_signature",
        "evidence_incomplete", "host_ca_unknown", "host_ca_unproven",
        "host_untrusted", "ima_boot_aggregate",
        "ima_log_empty", "ima_log_gap", "ima_log_unavailable", "ima_pcr_mismatch",
        "ima_policy", "ima_policy_signature", "ima_template_hash",
        "ima_unexpected_pcr", "instance_host_unknown", "internal_error", "magic",
        "malformed", "mb_missing_digest", "mb_pcr_mismatch", "mb_policy",
        "node_rebooted", "nonce_mismatch", "nonce_not_in_batch",
        "pcr_digest_mismatch", "pcr_policy", "pcr_selection", "pcr_values",
        "signature_hash", "signature_invalid", "signature_scheme", "unreachable",
        "unreachable_timeout", "revoked", "requested", "deleted",
    }
)  # fmt: skip

_PREFIX = "trusted_cloud_"

# -- verifier: counters and histograms --------------------------------------
ATTESTATIONS = Counter(
    _PREFIX + "attestations",
    "Quotes judged, by mode (pull, push), result (pass, fail) and failure "
    "reason (none when passed, other for a reason not in the known set).",
    ["mode", "result", "reason"],
    registry=REGISTRY,
)
QUOTE_ROUND = Histogram(
    _PREFIX + "quote_round_seconds",
    "Duration of a quote round: from the request to the verdict (pull), "
    "from the evidence received to the verdict (push).",
    ["mode"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
    registry=REGISTRY,
)
NODE_TRANSITIONS = Counter(
    _PREFIX + "node_transitions",
    "Committed changes of the verifier's word on a node, by event kind "
    "(revoked, failed, unreachable, recovered, host_untrusted) and reason.",
    ["kind", "reason"],
    registry=REGISTRY,
)
PUSH_SESSIONS = Counter(
    _PREFIX + "push_sessions",
    "Push sessions of agents that post evidence, by step (opened, granted).",
    ["step"],
    registry=REGISTRY,
)

# -- verifier: gauges set at scrape time ------------------------------------
NODES = Gauge(
    _PREFIX + "nodes",
    "Nodes this verifier process attests, by state and mode.",
    ["state", "mode"],
    registry=REGISTRY,
)
POLICIES_IN_FORCE = Gauge(
    _PREFIX + "policies_in_force",
    "Distinct stored runtime and measured-boot policy versions in force on "
    "the nodes this process attests.",
    registry=REGISTRY,
)
QUOTE_LAG = Gauge(
    _PREFIX + "quote_lag_seconds",
    "How long the most overdue quote round of this process has been due "
    "(0 when none is late).",
    registry=REGISTRY,
)
OUTBOX_DEPTH = Gauge(
    _PREFIX + "outbox_depth",
    "Signed events not yet delivered (the shared outbox: every verifier "
    "process reports the same figure).",
    registry=REGISTRY,
)
OUTBOX_OLDEST_AGE = Gauge(
    _PREFIX + "outbox_oldest_age_seconds",
    "Age of the oldest undelivered event (0 when the outbox is empty).",
    registry=REGISTRY,
)

HOSTS = Gauge(
    _PREFIX + "hosts",
    "Enrolled compute hosts by verdict: trusted (attested), untrusted "
    "(failed their evidence: their guests are marked host_untrusted) or "
    "unknown (not attested yet, unreachable or failed). The hosts table is "
    "shared: every verifier process reports the same figures.",
    ["state"],
    registry=REGISTRY,
)
#: The ``state`` label values of :data:`HOSTS`.
HOST_STATES = ("trusted", "untrusted", "unknown")
LOG_ENTRIES = Gauge(
    _PREFIX + "log_entries",
    "Entries in the attestation log's signed tree (the shared log: every "
    "verifier process reports the same figure).",
    registry=REGISTRY,
)
LOG_UNSEQUENCED = Gauge(
    _PREFIX + "log_unsequenced",
    "Verdict changes staged for the attestation log and not yet in its signed tree.",
    registry=REGISTRY,
)
LOG_OLDEST_UNSEQUENCED_AGE = Gauge(
    _PREFIX + "log_oldest_unsequenced_age_seconds",
    "Age of the oldest staged entry the sequencer has not appended (0 when "
    "none waits).",
    registry=REGISTRY,
)

# -- registrar, keyservice ---------------------------------------------------
REGISTRATIONS = Counter(
    _PREFIX + "registrations",
    "Agent registrations, by result (accepted, refused).",
    ["result"],
    registry=REGISTRY,
)
ACTIVATIONS = Counter(
    _PREFIX + "activations",
    "AK activations, by result (activated, refused).",
    ["result"],
    registry=REGISTRY,
)
KEY_RELEASES = Counter(
    _PREFIX + "key_releases",
    "Key requests of the key service, by kind (secret, group) and result "
    "(released, refused).",
    ["kind", "result"],
    registry=REGISTRY,
)

# -- revocation listener (hooks) ---------------------------------------------
HOOK_ACTIONS = Counter(
    _PREFIX + "hook_actions",
    "Hook actions run on revocation events, by action and result (succeeded, failed).",
    ["action", "result"],
    registry=REGISTRY,
)
HOOK_DEAD_LETTERS = Counter(
    _PREFIX + "hook_dead_letters",
    "Events an action gave up on after its last attempt, by action.",
    ["action"],
    registry=REGISTRY,
)

# A revocation's series exist from the start (at 0), so that the first
# revocation of a reason is an increase Prometheus sees (``increase()`` of a
# series that appears at 1 is 0): bounded, len(REASONS) + 1 series.
for _reason in sorted(REASONS | {"other"}):
    NODE_TRANSITIONS.labels("revoked", _reason)
NODE_TRANSITIONS.labels("host_untrusted", "host_untrusted")

_ATTESTED: dict[tuple[str, str, str], Counter] = {}
_ROUNDS: dict[str, Histogram] = {}


def reason_label(reason: str | None) -> str:
    """The label value of a failure ``reason``: a known code, ``none``
    (no failure) or ``other`` (anything else: never free text)."""
    if reason is None:
        return "none"
    return reason if reason in REASONS else "other"


def attestation(mode: str, passed: bool, reason: str | None) -> None:
    """Count one judged quote (the hot path: one dict look-up, one add).

    Args:
        mode: ``pull`` or ``push``.
        passed: whether the verdict was good.
        reason: the failure code (None when passed).
    """
    key = (mode, "pass" if passed else "fail", reason_label(reason))
    child = _ATTESTED.get(key)
    if child is None:
        child = _ATTESTED[key] = ATTESTATIONS.labels(*key)
    child.inc()


def judged(mode: str, verdict: Verdict, started: float) -> None:
    """Count a judged quote and time its round.

    Args:
        mode: ``pull`` or ``push``.
        verdict: the state machine's verdict.
        started: :func:`time.perf_counter` when the round began.
    """
    passed = bool(verdict)
    reason = None
    if not passed:
        change = verdict.transition
        reason = change.reason if change is not None else "revoked"
    attestation(mode, passed, reason)
    histogram = _ROUNDS.get(mode)
    if histogram is None:
        histogram = _ROUNDS[mode] = QUOTE_ROUND.labels(mode)
    histogram.observe(time.perf_counter() - started)


def transition(kind: str, reason: str | None) -> None:
    """Count a committed change of a node's state (its event's ``kind``,
    ``node.revoked`` or ``revoked``, and its reason)."""
    NODE_TRANSITIONS.labels(kind.removeprefix("node."), reason_label(reason)).inc()


def hook_action(action: str, succeeded: bool) -> None:
    """Count one run of hook ``action`` (a configured plugin's name: a
    bounded set)."""
    result = "succeeded" if succeeded else "failed"
    HOOK_ACTIONS.labels(action, result).inc()


def dead_letter(action: str) -> None:
    """Count an event hook ``action`` gave up on."""
    HOOK_DEAD_LETTERS.labels(action).inc()


def push_session(step: str) -> None:
    """Count a push session ``opened`` (nonce handed out) or ``granted``."""
    PUSH_SESSIONS.labels(step).inc()


@contextlib.contextmanager
def counted(counter: Counter, ok: str, refused: str, *labels: str) -> Iterator[None]:
    """Count the block's outcome in ``counter``: the result label ``ok``
    when it returns, ``refused`` when it raises (the error propagates).

    Args:
        counter: a counter whose last label is the result.
        ok, refused: the result values.
        labels: the values of its other labels, in order.
    """
    try:
        yield
    except Exception:  # counted, then propagated (a cancellation is not)
        counter.labels(*labels, refused).inc()
        raise
    counter.labels(*labels, ok).inc()
