"""Counts that tell how the durable machinery is doing, for the admin's overview and the command line.

Every number reads an index range (unfinished runs, runs finished since a time, pending work
items), never the whole runs table.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict

from django.db import DatabaseError
from django.db.models import Count, Min
from django.utils import timezone

from . import conf
from .humanize import duration
from .models import Worker, WorkflowRun, WorkItem

Status = WorkflowRun.Status
UNFINISHED = [Status.PENDING, Status.RUNNING, Status.WAITING, Status.BLOCKED, Status.PAUSED]
OUTCOMES = {  # what a finished run counts as
    "completed": [Status.COMPLETED],
    "failed": [Status.FAILED, Status.TIMED_OUT, Status.COMPENSATION_FAILED],
    "cancelled": [Status.CANCELLED],
}


def live_workers_since() -> dt.datetime:
    """Workers seen after this are live (DURABLE_WORKER_STALE_SECONDS)."""
    return timezone.now() - dt.timedelta(seconds=float(conf.get("WORKER_STALE_SECONDS")))


def unserved_queues(queues) -> set[str]:
    """Those of `queues` no live worker takes work from (a worker started without --queues takes every queue)."""
    queues = set(queues)
    if not queues:
        return set()
    served = set()
    live = Worker.objects.filter(stopped_at__isnull=True, last_seen__gte=live_workers_since())  # a stopped one serves none
    for listed in live.values_list("queues", flat=True):
        if not listed.strip():
            return set()
        served.update(name.strip() for name in listed.split(","))
    return queues - served


HOUR = dt.timedelta(hours=1)
# A past hour's counts are kept once it ended this long ago (a run's finish may commit a moment
# after its finished_at), in the project's default cache, for two days.
SETTLED = dt.timedelta(minutes=5)


def finished_by_hour(now) -> dict:
    """{hour start: {(queue, status): n}} of the runs finished in the last 24 hours, the first and
    the current hour partly. The overview's day chart and its table both read this; the hours that
    ended are counted once and cached, so a load reads only the runs of the last hour or so, however
    many finish in a day (an hour at most is counted live, plus the first, partial hour)."""
    from django.core.cache import cache

    start = now - dt.timedelta(days=1)
    first = start.replace(minute=0, second=0, microsecond=0) + HOUR  # the first whole hour
    settled = (now - SETTLED).replace(minute=0, second=0, microsecond=0)  # whole hours end here
    hours = []
    moment = first
    while moment + HOUR <= settled:
        hours.append(moment)
        moment += HOUR
    prefix = f"durable:finished:{conf.get('DATABASE')}:"
    kept = cache.get_many([prefix + h.isoformat() for h in hours])
    counts = {h: kept[prefix + h.isoformat()] for h in hours if prefix + h.isoformat() in kept}
    missing = [h for h in hours if h not in counts]
    if missing:
        counted = _by_hour(missing[0], missing[-1] + HOUR)
        fresh = {h: counted.get(h, {}) for h in missing}
        cache.set_many({prefix + h.isoformat(): value for h, value in fresh.items()}, timeout=2 * 24 * 3600)
        counts.update(fresh)
    for h, value in _by_hour(start, first).items():  # the first, partial hour
        counts[h] = value
    for h, value in _by_hour(hours[-1] + HOUR if hours else first, None).items():  # since then, live
        counts.setdefault(h, {}).update(value)
    return counts


def _by_hour(since, until) -> dict:
    from django.db.models.functions import Trunc

    runs = WorkflowRun.objects.filter(finished_at__gte=since)
    if until is not None:
        runs = runs.filter(finished_at__lt=until)
    counted: dict = defaultdict(dict)
    rows = (runs.order_by().annotate(at=Trunc("finished_at", "hour", tzinfo=dt.timezone.utc))
            .values_list("at", "queue", "status").annotate(n=Count("pk")))
    for at, queue, status, n in rows:
        counted[at][(queue, status)] = n
    return counted


def status_table(now, by_hour: dict | None = None):
    """Rows per queue: unfinished runs by status now, and runs finished in the last 24 hours by
    outcome (`by_hour`: finished_by_hour(now), if the caller has it already); `unserved` where runs
    are unfinished and no live worker takes that queue."""
    cells: dict = defaultdict(lambda: defaultdict(int))
    unfinished = (
        WorkflowRun.objects.filter(status__in=UNFINISHED).order_by()
        .values_list("queue", "status").annotate(n=Count("pk"))
    )
    for queue, status, n in unfinished:
        cells[queue][status] += n
    for hour in (by_hour if by_hour is not None else finished_by_hour(now)).values():
        for (queue, status), n in hour.items():
            for label, statuses in OUTCOMES.items():
                if status in statuses:
                    cells[queue][label] += n
    columns = [status.value for status in UNFINISHED] + list(OUTCOMES)
    waiting = {queue for queue in cells if any(cells[queue][status.value] for status in UNFINISHED)}
    unserved = unserved_queues(waiting)
    rows = [{"queue": queue, "cells": [cells[queue][c] for c in columns], "unserved": queue in unserved}
            for queue in sorted(cells)]
    totals = [sum(row["cells"][i] for row in rows) for i in range(len(columns))]
    return {"columns": columns, "rows": rows, "totals": totals, "unfinished": len(UNFINISHED)}


def queue_lag(now, paused: dict[str, str] | None = None):
    """Per queue with work ready, running, a limit (DURABLE_QUEUES, or set at runtime) or paused:
    how many items are ready now and how long the oldest has waited (the partial index), how many
    are being processed, the queue's limits and whether they hold work back now. `paused`: the
    paused queues and why, when the caller read them already."""
    from .models import QueueControl
    from .queues import configured

    if paused is None:
        paused = dict(QueueControl.objects.filter(paused=True).values_list("name", "reason"))
    ready = {queue: (n, oldest) for queue, n, oldest in (
        WorkItem.objects.filter(status=WorkItem.Status.PENDING, available_at__lte=now).order_by()
        .values_list("queue").annotate(n=Count("pk"), oldest=Min("available_at"))
    )}
    running = dict(WorkItem.objects.filter(status=WorkItem.Status.PROCESSING).order_by()
                   .values_list("queue").annotate(n=Count("pk")))
    limits = configured()
    rows = []
    for queue in sorted(ready.keys() | running.keys() | limits.keys() | paused.keys()):
        n, oldest = ready.get(queue, (0, None))
        limit = limits.get(queue)
        waited = (now - oldest).total_seconds() if oldest is not None else None
        full = limit is not None and limit.concurrency is not None and running.get(queue, 0) >= limit.concurrency
        rows.append({"queue": queue, "ready": n, "lag_seconds": waited,
                     "lag": duration(waited) if waited is not None else "",
                     "running": running.get(queue, 0),
                     "limits": limit.describe() if limit is not None else "",
                     "full": full, "paused": queue in paused, "reason": paused.get(queue, "")})
    return rows


def finished_since(since: dt.datetime) -> dict[str, int]:
    """Runs finished since `since`, by outcome."""
    counts = dict.fromkeys(OUTCOMES, 0)
    finished = WorkflowRun.objects.filter(finished_at__gte=since).order_by().values_list("status").annotate(n=Count("pk"))
    for status, n in finished:
        for label, statuses in OUTCOMES.items():
            if status in statuses:
                counts[label] += n
    return counts


def summary(now: dt.datetime | None = None) -> dict:
    """Everything `manage.py durable stats` prints, as plain data."""
    now = now or timezone.now()
    unfinished = dict.fromkeys(UNFINISHED, 0)
    for status, n in WorkflowRun.objects.filter(status__in=UNFINISHED).order_by().values_list("status").annotate(
            n=Count("pk")):
        unfinished[status] = n
    workers = Worker.objects.filter(stopped_at__isnull=True)
    since = live_workers_since()
    last_hour = finished_since(now - dt.timedelta(hours=1))
    return {
        "at": now.isoformat(),
        "unfinished": {str(k): v for k, v in unfinished.items()},
        "finished_last_hour": last_hour,
        "finished_last_day": finished_since(now - dt.timedelta(days=1)),
        "finished_per_minute": round(sum(last_hour.values()) / 60, 2),  # over the last hour
        "queues": queue_lag(now),
        "expired_claims": WorkItem.objects.expired().count(),
        "workers": {"live": workers.filter(last_seen__gte=since).count(),
                    "stale": workers.filter(last_seen__lt=since).count()},
        "horizon": [holder.as_dict() for holder in _horizon()],
    }


def _horizon() -> list:
    """What holds VACUUM's horizon back, oldest first (django_durable.horizon); [] if not known."""
    from . import horizon

    try:
        return horizon.holders(limit=3)
    except DatabaseError:
        return []
