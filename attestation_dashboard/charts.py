"""Server-rendered inline SVG charts (no JavaScript): the counts of nodes
by state as labelled bars, and a node's attestation history as a timeline
of verified and failed points.

Colours are Bootstrap 3's (Horizon's default theme): green for verified,
red for failed or revoked, orange for unreachable, grey for the rest; every
mark also carries its text (a label, or a ``<title>`` tooltip), so the
charts read without colour too.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, Sequence
from html import escape

from django.utils.safestring import SafeString, mark_safe

from attestation_dashboard.api.attestation import HistoryEntry

__all__ = ["STATE_ORDER", "count_states", "state_bars", "timeline"]

#: States in the order the bar chart lists them (others follow, sorted).
STATE_ORDER = (
    "attested",
    "bootstrapping",
    "registered",
    "created",
    "pending",
    "unreachable",
    "failed",
    "revoked",
    "host_untrusted",
)
_GREEN, _RED, _ORANGE, _GREY, _BLUE = (
    "#5cb85c",
    "#d9534f",
    "#f0ad4e",
    "#777777",
    "#337ab7",
)
_STATE_COLOUR = {
    "attested": _GREEN,
    "recovered": _GREEN,
    "failed": _RED,
    "revoked": _RED,
    "host_untrusted": _RED,
    "unreachable": _ORANGE,
}
#: History entry kinds -> (class, colour): what the timeline plots.
_KIND = {
    "attested": ("verified", _GREEN),
    "recovered": ("verified", _GREEN),
    "failed": ("failed", _RED),
    "revoked": ("failed", _RED),
    "host_untrusted": ("failed", _RED),
    "unreachable": ("unreachable", _ORANGE),
    "policy_changed": ("policy", _BLUE),
}
_FONT = 'font-family="Helvetica Neue, Helvetica, Arial, sans-serif" font-size="12"'


def _ordered(counts: Mapping[str, int]) -> list[tuple[str, int]]:
    known = [(s, counts.get(s, 0)) for s in STATE_ORDER]
    rest = sorted((s, n) for s, n in counts.items() if s not in STATE_ORDER)
    return known + rest


def state_bars(counts: Mapping[str, int], svg_id: str = "state-chart") -> SafeString:
    """A horizontal bar per state with its name and count (states with no
    node included, so the chart's shape is stable).

    Args:
        counts: state -> number of nodes.
        svg_id: the ``id`` of the ``<svg>`` element.
    """
    rows = _ordered(counts)
    top = max([n for _, n in rows] + [1])
    label_w, bar_w, row_h = 120, 300, 22
    height = row_h * len(rows) + 8
    width = label_w + bar_w + 60
    total = sum(n for _, n in rows)
    out = [
        f'<svg id="{escape(svg_id)}" class="attestation-chart" role="img" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'xmlns="http://www.w3.org/2000/svg" {_FONT}>',
        f"<title>Nodes by state ({total} in all)</title>",
    ]
    for i, (state, n) in enumerate(rows):
        y = 4 + i * row_h
        w = round(bar_w * n / top) if n else 0
        colour = _STATE_COLOUR.get(state, _GREY)
        s = escape(state)
        out.append(
            f'<g class="state-bar" data-state="{s}" data-count="{n}">'
            f'<text x="{label_w - 6}" y="{y + 15}" text-anchor="end" '
            f'fill="#333">{s}</text>'
            f'<rect x="{label_w}" y="{y + 3}" width="{w}" height="{row_h - 6}" '
            f'fill="{colour}"><title>{s}: {n}</title></rect>'
            f'<text x="{label_w + w + 6}" y="{y + 15}" fill="#333">{n}</text></g>'
        )
    out.append("</svg>")
    return mark_safe("".join(out))  # noqa: S308 (every text above is escaped)


def _when(seconds: float) -> str:
    when = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    return when.strftime("%Y-%m-%d %H:%M:%SZ")


def timeline(
    entries: Sequence[HistoryEntry],
    now: float | None = None,
    svg_id: str = "quote-timeline",
) -> SafeString:
    """A node's history as points on a time axis: verified (green, upper
    row), failed or revoked (red, lower row), unreachable (orange) and
    policy changes (blue, on the axis); each point's ``<title>`` says
    what, when and why.

    Args:
        entries: the node's log entries (any order).
        now: the right end of the axis (None: the last entry's time).
        svg_id: the ``id`` of the ``<svg>`` element.
    """
    points = [e for e in entries if e.created_at is not None]
    width, height, left, right = 640, 120, 40, 20
    out = [
        f'<svg id="{escape(svg_id)}" class="attestation-chart" role="img" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'xmlns="http://www.w3.org/2000/svg" {_FONT}>',
        f"<title>Attestation history ({len(points)} entries)</title>",
        f'<text x="4" y="34" fill="{_GREEN}">ok</text>',
        f'<text x="4" y="84" fill="{_RED}">fail</text>',
        f'<line x1="{left}" y1="60" x2="{width - right}" y2="60" stroke="#ccc"/>',
    ]
    if not points:
        out.append(
            f'<text x="{width // 2}" y="64" text-anchor="middle" fill="#777">'
            "no entries in the attestation log yet</text></svg>"
        )
        return mark_safe("".join(out))  # noqa: S308
    times = [float(e.created_at) for e in points if e.created_at is not None]
    start = min(times)
    end = max(times + ([now] if now is not None else []))
    span = max(end - start, 1.0)
    for entry in sorted(points, key=lambda e: (e.created_at or 0.0, e.index)):
        assert entry.created_at is not None
        x = left + (width - left - right) * (entry.created_at - start) / span
        klass, colour = _KIND.get(entry.kind, ("other", _GREY))
        y = {"verified": 30, "failed": 80, "unreachable": 80}.get(klass, 60)
        tip = escape(f"{_when(entry.created_at)} {entry.kind}: {entry.reason}")
        if entry.detail:
            tip += escape(f" ({entry.detail})")
        out.append(
            f'<circle class="point {klass}" data-kind="{escape(entry.kind)}" '
            f'cx="{x:.1f}" cy="{y}" r="6" fill="{colour}" stroke="#fff">'
            f"<title>{tip}</title></circle>"
        )
    out.append(
        f'<text x="{left}" y="112" fill="#777">{escape(_when(start))}</text>'
        f'<text x="{width - right}" y="112" text-anchor="end" fill="#777">'
        f"{escape(_when(end))}</text></svg>"
    )
    return mark_safe("".join(out))  # noqa: S308


def count_states(states: Iterable[str]) -> dict[str, int]:
    """state -> how many of ``states``."""
    counts: dict[str, int] = {}
    for state in states:
        counts[state] = counts.get(state, 0) + 1
    return counts
