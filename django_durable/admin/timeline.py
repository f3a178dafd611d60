"""The timeline picture of a run: its journal entries as bars on a time axis, drawn as SVG on the server.

No JavaScript: each bar carries a <title> that browsers show as a tooltip. Steps are solid
bars; sleeps and waits are outlined; a back-off before a retry is a dashed tail; parallel
branches are indented under their group and overlap in time.
"""

from __future__ import annotations

import datetime as dt

from django.utils import timezone
from django.utils.html import escape
from django.utils.safestring import mark_safe

from .display import duration, progress_text

WIDTH = 960
LABEL = 230
RIGHT = 80
ROW = 20
DEADLINE_REACH = 3  # a deadline up to 3 times the drawn span ahead stretches the axis to it
AXIS = 28
WAITS = {"sleep", "signal", "event", "child", "parallel"}
TOLD = {"log", "progress"}  # drawn as a mark at a moment, labelled with what the workflow said
COLOURS = {
    "completed": "#2e7d32", "failed": "#c62828", "running": "#1565c0", "retrying": "#ef6c00", "waiting": "#6a1b9a",
}


def render(run, steps, *, branch_keys=frozenset(), now: dt.datetime | None = None, total: int | None = None):
    """Return the SVG (safe HTML) of `steps` (Step rows in seq order) of `run`."""
    now = now or timezone.now()
    start = run.created_at
    # What is still open (a wait, a running step) lasts until now, or until the run ended.
    open_until = run.finished_at or now
    end = open_until
    for step in steps:
        for moment in (step.started_at, step.finished_at, step.retry_at):
            if moment is not None:
                start, end = min(start, moment), max(end, moment)
    # A deadline of something still open is drawn where it is: the axis reaches it, unless it is
    # so far ahead that the bars would shrink to slivers; then an arrow at the edge points to it.
    reach = end + (end - start) * DEADLINE_REACH
    for step in steps:
        if _still_open(step, run) and step.deadline_at is not None and end < step.deadline_at <= reach:
            end = step.deadline_at
    span = max((end - start).total_seconds(), 0.001)
    plot = WIDTH - LABEL - RIGHT

    def x(moment: dt.datetime) -> float:
        return LABEL + plot * (moment - start).total_seconds() / span

    height = AXIS + ROW * (len(steps) + 1) + 10
    parts = [
        f'<svg class="durable-timeline" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" '
        f'width="{WIDTH}" height="{height}" role="img" aria-label="Timeline of the run">',
        '<defs><pattern id="durable-hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><line x1="0" y1="0" x2="0" y2="6" stroke="#9e9e9e" stroke-width="2"/>'
        '</pattern></defs>',
    ]
    # The axis: five ticks, times relative to the run's creation.
    for index in range(6):
        offset = span * index / 5
        tick = LABEL + plot * index / 5
        parts.append(f'<line x1="{tick:.1f}" y1="{AXIS - 6}" x2="{tick:.1f}" y2="{height - 6}" class="grid"/>')
        parts.append(f'<text x="{tick:.1f}" y="{AXIS - 10}" text-anchor="middle" class="tick">+{escape(duration(offset))}</text>')
    # The run itself, as the first row.
    y = AXIS
    run_end = run.finished_at or now
    parts.append(_label(y, f"run ({run.status})", bold=True))
    parts.append(_bar(x(run.created_at), x(run_end), y, "#90a4ae", outline=run.finished_at is None,
                      title=f"run {run.status}: {duration((run_end - run.created_at).total_seconds())}"))
    if run.started_at:
        parts.append(f'<line x1="{x(run.started_at):.1f}" y1="{y + 2}" x2="{x(run.started_at):.1f}" '
                     f'y2="{y + ROW - 4}" class="mark"><title>started</title></line>')
    for step in steps:
        y += ROW
        if step.kind in TOLD:
            parts.append(_told(step, y, x(step.started_at or step.finished_at or run.created_at)))
            continue
        indent = step.key in branch_keys
        parts.append(_label(y, ("↳ " if indent else "") + step.key, indent=indent))
        began = step.started_at or step.finished_at or run.created_at
        finished = open_until if _still_open(step, run) else (step.finished_at or open_until)
        colour = COLOURS.get(step.status, "#607d8b")
        if step.kind == "rollback":
            colour = "#5d4037" if step.status == "completed" else colour
        wait = step.kind in WAITS
        summary = f"{step.key}: {step.get_kind_display().lower()}, {step.status}"
        if step.attempts > 1:
            summary += f", {step.attempts} attempts"
        summary += f", {duration((finished - began).total_seconds())}"
        if step.status == "retrying" and step.retry_at:
            summary += f", next attempt at {step.retry_at:%Y-%m-%d %H:%M:%S}"
        parts.append(_bar(x(began), x(finished), y, colour, outline=wait, title=summary))
        if step.status == "retrying" and step.retry_at:
            # The back-off: a dashed tail from the failed attempt to the next one.
            parts.append(f'<line x1="{x(finished):.1f}" y1="{y + ROW / 2 - 2:.1f}" x2="{x(step.retry_at):.1f}" '
                         f'y2="{y + ROW / 2 - 2:.1f}" stroke="{colour}" stroke-dasharray="4 3" stroke-width="2">'
                         f'<title>{escape(summary)}</title></line>')
        if step.deadline_at and _still_open(step, run):
            title = f"deadline {step.deadline_at:%Y-%m-%d %H:%M:%S} UTC"
            if step.deadline_at <= end:
                mark = x(max(step.deadline_at, start))
                parts.append(f'<line x1="{mark:.1f}" y1="{y + 1}" x2="{mark:.1f}" y2="{y + ROW - 5}" '
                             f'stroke="#c62828" stroke-width="2" class="deadline"><title>{title}</title></line>')
            else:
                parts.append(f'<text x="{WIDTH - RIGHT + 2}" y="{y + 12}" class="deadline-ahead" fill="#c62828">'
                             f'→ {escape(duration((step.deadline_at - now).total_seconds()))}<title>{title}</title></text>')
        if step.attempts > 1:
            parts.append(f'<text x="{min(x(finished) + 4, WIDTH - RIGHT + 4):.1f}" y="{y + 12}" class="attempts">'
                         f'×{step.attempts}</text>')
    if total is not None and total > len(steps):
        y += ROW
        parts.append(f'<text x="8" y="{y + 12}" class="more">… and {total - len(steps)} more entries</text>')
    parts.append("</svg>")
    return mark_safe("".join(parts))


def _still_open(step, run) -> bool:
    """A step or wait that has not ended (in a run that has not ended either)."""
    return step.status in ("running", "waiting") and run.finished_at is None


def _told(step, y: float, at: float) -> str:
    """A note or the run's progress: a diamond at the moment it was said, its words as the label."""
    from .. import serialization

    if step.kind == "log":
        text = (serialization.decode(step.result) or {}).get("message", "")
    else:
        text = f"progress {progress_text(step.result)}"
    half = (ROW - 8) / 2
    middle = y + 3 + half
    return (_label(y, text) + f'<path d="M{at:.1f},{middle - half:.1f} L{at + half:.1f},{middle:.1f} '
            f'L{at:.1f},{middle + half:.1f} L{at - half:.1f},{middle:.1f} Z" fill="#455a64" class="told">'
            f'<title>{escape(text)}</title></path>')


def _label(y: float, text: str, *, bold: bool = False, indent: bool = False) -> str:
    shown = text if len(text) <= 30 else text[:29] + "…"
    weight = ' font-weight="bold"' if bold else ""
    return (f'<text x="{18 if indent else 8}" y="{y + 13}" class="label"{weight}>{escape(shown)}'
            f'<title>{escape(text)}</title></text>')


def _bar(x1: float, x2: float, y: float, colour: str, *, outline: bool, title: str) -> str:
    width = max(x2 - x1, 2.0)
    if outline:
        style = f'fill="url(#durable-hatch)" stroke="{colour}" stroke-width="1.5"'
    else:
        style = f'fill="{colour}"'
    return (f'<rect x="{x1:.1f}" y="{y + 3}" width="{width:.1f}" height="{ROW - 8}" rx="2" {style}>'
            f'<title>{escape(title)}</title></rect>')
