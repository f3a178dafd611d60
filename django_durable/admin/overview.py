"""The overview page: what is unfinished, how late the queues are, what finished lately, as
server-rendered charts. Every number comes from an index range, never a scan of all runs."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict

from django.contrib import admin
from django.db.models import Count
from django.db.models.functions import Trunc
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape
from django.utils.safestring import mark_safe

from ..health import horizon_check
from ..models import Overview, QueueControl, Schedule, Worker, WorkflowRun, WorkItem
from ..stats import (
    OUTCOMES,
    finished_by_hour,
    live_workers_since,
    queue_lag,
    status_table,
)
from . import display
from .base import PageAdmin

COLOURS = {"completed": "#2e7d32", "failed": "#c62828", "cancelled": "#9e9e9e"}  # of the stacked bars


@admin.register(Overview)
class OverviewAdmin(PageAdmin):
    def get_urls(self):
        from django.urls import path

        return self.page_urls(path("queues/<str:queue>/", self.admin_site.admin_view(self.queue_view),
                                   name="django_durable_overview_queue"))

    def queue_view(self, request, queue):
        """Steer a queue from the overview (POST): pause, resume, set or clear its limits."""
        from django.contrib import messages
        from django.core.exceptions import PermissionDenied
        from django.http import HttpResponseNotAllowed, HttpResponseRedirect

        from ..services import queue_control

        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not request.user.has_perm("django_durable.change_queuecontrol"):
            raise PermissionDenied
        by, action = request.user.get_username(), request.POST.get("action", "")
        try:
            if action == "pause":
                queue_control.pause_queue(queue, reason=request.POST.get("reason", ""), by=by)
                done = f"Paused the queue {queue}: no worker claims from it until it is resumed."
            elif action == "resume":
                queue_control.resume_queue(queue, by=by)
                done = f"Resumed the queue {queue}."
            elif action == "limits":
                given = {name: request.POST.get(name, "").strip() for name in ("concurrency", "key_concurrency", "rate_limit")}
                queue_control.set_queue_limits(
                    queue, by=by, rate_limit=given["rate_limit"] or None,
                    **{name: queue_control.limit_of(given[name], name) for name in ("concurrency", "key_concurrency")})
                done = f"Set the limits of the queue {queue}."
            elif action == "clear":
                queue_control.clear_queue(queue, by=by)
                done = f"The queue {queue} is as DURABLE_QUEUES sets it again."
            else:
                raise ValueError(f"Not a change of a queue: {action[:40]!r}.")
        except ValueError as exc:
            self.message_user(request, str(exc), messages.ERROR)
        else:
            self.message_user(request, done, messages.SUCCESS)
        return HttpResponseRedirect(reverse(f"{self.admin_site.name}:django_durable_overview_changelist") + "#durable-queue-lag")

    def changelist_view(self, request, extra_context=None):
        self.check_view(request)
        from .. import conf, queues

        controls = list(QueueControl.objects.values_list("name", "concurrency", "key_concurrency", "rate_limit",
                                                         "paused", "reason"))
        queues.refresh(conf.get("DATABASE"), rows=[row[:4] for row in controls])  # the limits as set at runtime too
        now = timezone.now()
        by_hour = finished_by_hour(now)  # the day's whole hours are counted once, then cached
        runs_url = reverse(f"{self.admin_site.name}:django_durable_workflowrun_changelist")
        context = self.page_context(
            request, "Durable workflows: overview",
            now=now, runs_url=runs_url,
            table=status_table(now, by_hour),
            lag=queue_lag(now, paused={name: reason for name, *_, paused, reason in controls if paused}),
            expired_claims=WorkItem.objects.expired().count(),
            workers=worker_summary(),
            hour_chart=chart(finished_buckets(now, dt.timedelta(hours=1), "minute", 5), "5 minutes"),
            day_chart=chart(finished_buckets(now, dt.timedelta(days=1), "hour", 1, counts=[
                (at, status, n) for at, hour in by_hour.items() for (_, status), n in hour.items()]), "hour"),
            failures=recent_failures(with_message=request.user.has_perm("django_durable.view_payload_workflowrun")),
            schedules=list(Schedule.objects.filter(status=Schedule.Status.ACTIVE, next_fire_at__isnull=False)
                           .order_by("next_fire_at")[:5]),
            horizon=horizon_check(),
            can_steer=request.user.has_perm("django_durable.change_queuecontrol"),
            overridden={name for name, concurrency, key_concurrency, rate_limit, *_ in controls
                        if concurrency is not None or key_concurrency is not None or rate_limit},
        )
        return TemplateResponse(request, "admin/django_durable/overview.html", context)


def worker_summary():
    since = live_workers_since()
    rows = list(Worker.objects.filter(stopped_at__isnull=True).order_by("-last_seen")[:50])
    live = [w for w in rows if w.last_seen >= since]
    return {"live": len(live), "stale": len(rows) - len(live), "rows": live[:10]}


def finished_buckets(now, span: dt.timedelta, unit: str, width: int, counts=None):
    """[(bucket start, {outcome: count})] over `span` before now, buckets of `width` `unit`s;
    `counts`: the (unit start, status, n) of that span, when the caller has them."""
    step = dt.timedelta(**{f"{unit}s": width})
    start = now - span
    if counts is None:
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
            for label, statuses in OUTCOMES.items():
                if status in statuses:
                    buckets[index][1][label] += n
    return buckets


LABEL_HALF = 18


def chart(buckets, unit_label: str, width: int = 460, height: int = 140):
    """A stacked bar chart as SVG: completed, failed and cancelled runs per bucket."""
    top = max([sum(counts.values()) for _, counts in buckets] + [1])
    left, bottom = max(34, 10 + 7 * len(str(top))), 18  # room for the largest count's label
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
        tip = f"{moment:%H:%M} UTC: " + ", ".join(f"{counts[label]} {label}" for label in OUTCOMES)
        for label, colour in COLOURS.items():
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
            # A label is about 32 units wide: kept whole inside the chart at either end.
            centre = min(max(x + bar / 2, LABEL_HALF), width - LABEL_HALF)
            parts.append(f'<text x="{centre:.1f}" y="{height - 4}" text-anchor="middle" class="tick">'
                         f'{moment:%H:%M}</text>')
    parts.append("</svg>")
    total = {label: sum(counts[label] for _, counts in buckets) for label in OUTCOMES}
    return {"svg": mark_safe("".join(parts)), "total": total}


def recent_failures(*, with_message: bool, limit: int = 10):
    runs = list(
        WorkflowRun.objects.filter(status__in=OUTCOMES["failed"], finished_at__isnull=False)
        .defer("input", "result").order_by("-finished_at")[:limit]
    )
    for run in runs:
        run.error_text = display.error_summary(run.error, with_message=with_message, limit=120)
    return runs
