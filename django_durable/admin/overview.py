"""The overview page: what is unfinished, how late the queues are, what finished lately, as
server-rendered charts. Every number comes from an index range, never a scan of all runs."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict

from django.contrib import admin
from django.db.models import Count, Min
from django.db.models.functions import Trunc
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import escape
from django.utils.safestring import mark_safe

from ..models import Overview, Schedule, Worker, WorkflowRun, WorkItem
from . import display
from .base import DurableAdmin, live_workers_since

Status = WorkflowRun.Status
UNFINISHED = [Status.PENDING, Status.RUNNING, Status.WAITING]
OUTCOMES = [  # (label, statuses, colour) of the stacked bars
    ("completed", [Status.COMPLETED], "#2e7d32"),
    ("failed", [Status.FAILED, Status.TIMED_OUT, Status.COMPENSATION_FAILED], "#c62828"),
    ("cancelled", [Status.CANCELLED], "#9e9e9e"),
]


@admin.register(Overview)
class OverviewAdmin(DurableAdmin):
    def has_view_permission(self, request, obj=None):
        return request.user.has_perm(f"{self.opts.app_label}.view_workflowrun")

    def has_delete_permission(self, request, obj=None):
        return False

    def get_urls(self):
        name = f"{self.opts.app_label}_{self.opts.model_name}"
        return [path("", self.admin_site.admin_view(self.changelist_view), name=f"{name}_changelist")]

    def changelist_view(self, request, extra_context=None):
        if not self.has_view_permission(request):
            from django.core.exceptions import PermissionDenied

            raise PermissionDenied
        now = timezone.now()
        runs_url = reverse(f"{self.admin_site.name}:django_durable_workflowrun_changelist")
        context = self.page_context(
            request, "Durable workflows: overview",
            now=now, runs_url=runs_url,
            table=status_table(now),
            lag=queue_lag(now),
            expired_claims=WorkItem.objects.expired().count(),
            workers=worker_summary(),
            hour_chart=chart(finished_buckets(now, dt.timedelta(hours=1), "minute", 5), "5 minutes"),
            day_chart=chart(finished_buckets(now, dt.timedelta(days=1), "hour", 1), "hour"),
            failures=recent_failures(with_message=request.user.has_perm("django_durable.view_payload_workflowrun")),
            schedules=list(Schedule.objects.filter(status=Schedule.Status.ACTIVE, next_fire_at__isnull=False)
                           .order_by("next_fire_at")[:5]),
        )
        return TemplateResponse(request, "admin/django_durable/overview.html", context)


def status_table(now):
    """Rows per queue: unfinished runs by status now, and runs finished in the last 24 hours by outcome."""
    since = now - dt.timedelta(days=1)
    cells: dict = defaultdict(lambda: defaultdict(int))
    unfinished = (
        WorkflowRun.objects.filter(status__in=UNFINISHED).order_by()
        .values_list("queue", "status").annotate(n=Count("pk"))
    )
    for queue, status, n in unfinished:
        cells[queue][status] += n
    finished = (
        WorkflowRun.objects.filter(finished_at__gte=since).order_by()
        .values_list("queue", "status").annotate(n=Count("pk"))
    )
    for queue, status, n in finished:
        for label, statuses, _ in OUTCOMES:
            if status in statuses:
                cells[queue][label] += n
    columns = [status.value for status in UNFINISHED] + [label for label, _, _ in OUTCOMES]
    rows = [{"queue": queue, "cells": [cells[queue][c] for c in columns]} for queue in sorted(cells)]
    totals = [sum(row["cells"][i] for row in rows) for i in range(len(columns))]
    return {"columns": columns, "rows": rows, "totals": totals, "unfinished": len(UNFINISHED)}


def queue_lag(now):
    """Per queue: how many items are ready now and how long the oldest has waited (the partial index)."""
    ready = (
        WorkItem.objects.filter(status=WorkItem.Status.PENDING, available_at__lte=now).order_by()
        .values_list("queue").annotate(n=Count("pk"), oldest=Min("available_at"))
    )
    return [{"queue": queue, "ready": n, "lag": display.duration((now - oldest).total_seconds())}
            for queue, n, oldest in sorted(ready)]


def worker_summary():
    since = live_workers_since()
    rows = list(Worker.objects.filter(stopped_at__isnull=True).order_by("-last_seen")[:50])
    live = [w for w in rows if w.last_seen >= since]
    return {"live": len(live), "stale": len(rows) - len(live), "rows": live[:10]}


def finished_buckets(now, span: dt.timedelta, unit: str, width: int):
    """[(bucket start, {outcome: count})] over `span` before now, buckets of `width` `unit`s."""
    step = dt.timedelta(**{f"{unit}s": width})
    start = now - span
    counts = (
        WorkflowRun.objects.filter(finished_at__gte=start).order_by()
        .annotate(at=Trunc("finished_at", unit, tzinfo=dt.timezone.utc)).values_list("at", "status")
        .annotate(n=Count("pk"))
    )
    first = start.replace(second=0, microsecond=0, tzinfo=dt.timezone.utc) if unit == "minute" else \
        start.replace(minute=0, second=0, microsecond=0, tzinfo=dt.timezone.utc)
    if unit == "minute":
        first -= dt.timedelta(minutes=first.minute % width)
    buckets = []
    moment = first
    while moment <= now:
        buckets.append((moment, defaultdict(int)))
        moment += step
    for at, status, n in counts:
        index = int((at - first) / step)
        if 0 <= index < len(buckets):
            for label, statuses, _ in OUTCOMES:
                if status in statuses:
                    buckets[index][1][label] += n
    return buckets


def chart(buckets, unit_label: str, width: int = 460, height: int = 140):
    """A stacked bar chart as SVG: completed, failed and cancelled runs per bucket."""
    top = max([sum(counts.values()) for _, counts in buckets] + [1])
    left, bottom = 34, 18
    plot_w, plot_h = width - left - 6, height - bottom - 8
    bar = plot_w / max(len(buckets), 1)
    parts = [f'<svg class="durable-chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
             f'width="{width}" height="{height}" role="img" aria-label="Runs finished per {escape(unit_label)}">',
             f'<text x="{left - 4}" y="14" text-anchor="end" class="tick">{top}</text>',
             f'<text x="{left - 4}" y="{8 + plot_h}" text-anchor="end" class="tick">0</text>',
             f'<line x1="{left}" y1="{8 + plot_h}" x2="{width - 6}" y2="{8 + plot_h}" class="grid"/>']
    for index, (moment, counts) in enumerate(buckets):
        x = left + index * bar
        y = 8 + plot_h
        tip = f"{moment:%H:%M} UTC: " + ", ".join(f"{counts[label]} {label}" for label, _, _ in OUTCOMES)
        for label, _, colour in OUTCOMES:
            n = counts[label]
            if not n:
                continue
            h = plot_h * n / top
            y -= h
            parts.append(f'<rect x="{x + 1:.1f}" y="{y:.1f}" width="{max(bar - 2, 1):.1f}" height="{h:.1f}" '
                         f'fill="{colour}"><title>{escape(tip)}</title></rect>')
        if not sum(counts.values()):
            parts.append(f'<rect x="{x:.1f}" y="8" width="{bar:.1f}" height="{plot_h}" fill="transparent">'
                         f'<title>{escape(tip)}</title></rect>')
        if index % max(1, len(buckets) // 6) == 0:
            parts.append(f'<text x="{x + bar / 2:.1f}" y="{height - 4}" text-anchor="middle" class="tick">'
                         f'{moment:%H:%M}</text>')
    parts.append("</svg>")
    total = {label: sum(counts[label] for _, counts in buckets) for label, _, _ in OUTCOMES}
    return {"svg": mark_safe("".join(parts)), "total": total}


def recent_failures(*, with_message: bool, limit: int = 10):
    runs = list(
        WorkflowRun.objects.filter(status__in=OUTCOMES[1][1], finished_at__isnull=False)
        .defer("input", "result").order_by("-finished_at")[:limit]
    )
    for run in runs:
        run.error_text = display.error_summary(run.error, with_message=with_message, limit=120)
    return runs
