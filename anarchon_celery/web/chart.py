"""The lateness of a job's recent runs, drawn on the server as inline SVG (no script): one bar
per run, oldest on the left, its height the time from its slot to its send, coloured by the
run's status, with the median as a dashed line. Each bar's tooltip names the run."""

from __future__ import annotations

import datetime as dt
import statistics
from collections.abc import Sequence

from ..history import Run
from .render import duration, esc, when

__all__ = ["CHARTED_TRIGGERS", "lateness", "lateness_chart"]

#: The runs drawn: those sent for their slot. A catch-up, a backfill or a manual run is sent
#: long after (or without) a slot on purpose: the table shows its lateness.
CHARTED_TRIGGERS = ("schedule", "buffered")

WIDTH, HEIGHT = 760, 200
LEFT, RIGHT, TOP, BOTTOM = 64, 12, 14, 26
_TONES = {"succeeded": "good", "failed": "bad", "abandoned": "bad", "unsent": "bad", "revoked": "warn"}


def lateness(run: Run) -> int | None:
    """How late the run was sent: its send minus its slot, in ms (None for a run not sent)."""
    if run.sent_at_ms is None or run.slot is None:
        return None
    return run.sent_at_ms - run.slot


def _scale_top(highest: int) -> int:
    """The top of the scale: 1, 2 or 5 times a power of ten, at or above ``highest`` (ms)."""
    top = 1
    while True:
        for step in (1, 2, 5):
            if top * step >= highest:
                return top * step
        top *= 10


def lateness_chart(runs: Sequence[Run], tz: dt.tzinfo) -> str:
    """The chart of ``runs`` (newest first, as the history gives them), or a line saying there
    is nothing to draw."""
    drawn = [
        (run, late) for run in reversed(runs) if run.trigger in CHARTED_TRIGGERS and (late := lateness(run)) is not None
    ]
    if not drawn:
        return '<p class="muted">No scheduled run sent yet: nothing to chart.</p>'
    values = [late for _, late in drawn]
    top = _scale_top(max(10, *values))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    step = plot_w / max(len(drawn), 1)
    bar = max(1.0, min(24.0, step * 0.7))

    def y(ms: float) -> float:
        return TOP + plot_h - plot_h * max(0.0, min(ms, top)) / top

    parts = [
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="Lateness of the last {len(drawn)} scheduled runs">'
    ]
    for fraction in (0, 0.5, 1):
        at = y(top * fraction)
        parts.append(f'<line class="axis" x1="{LEFT}" y1="{at:.1f}" x2="{WIDTH - RIGHT}" y2="{at:.1f}"/>')
        label = duration(round(top * fraction))
        parts.append(f'<text x="{LEFT - 6}" y="{at + 4:.1f}" text-anchor="end">{esc(label)}</text>')
    for index, (run, late) in enumerate(drawn):
        x = LEFT + step * index + (step - bar) / 2
        top_y = y(late)
        height = max(1.0, TOP + plot_h - top_y)
        tone = _TONES.get(run.status, "")
        tip = f"{when(run.slot, tz)}: sent {duration(late)} late, {run.status} (run {run.run_id})"
        parts.append(
            f'<rect class="run {tone}" x="{x:.1f}" y="{TOP + plot_h - height:.1f}" width="{bar:.1f}" '
            f'height="{height:.1f}"><title>{esc(tip)}</title></rect>'
        )
    median = statistics.median(values)
    at = y(median)
    parts.append(f'<line class="median" x1="{LEFT}" y1="{at:.1f}" x2="{WIDTH - RIGHT}" y2="{at:.1f}"/>')
    first, last = drawn[0][0].slot, drawn[-1][0].slot
    parts.append(f'<text x="{LEFT}" y="{HEIGHT - 8}">{esc(when(first, tz))}</text>')
    parts.append(f'<text x="{WIDTH - RIGHT}" y="{HEIGHT - 8}" text-anchor="end">{esc(when(last, tz))}</text>')
    parts.append("</svg>")
    summary = (
        f'<p class="muted">Sent minus slot, for the last {len(drawn)} scheduled run(s): median '
        f"{esc(duration(round(median)))}, highest {esc(duration(max(values)))}. Catch-up, backfill and "
        "manual runs are in the table only.</p>"
    )
    return "".join(parts) + summary
