"""Schedules: start a workflow by a cron expression or at a fixed interval, once per fire time.

    from django_durable import schedules
    schedules.ensure_schedule("nightly-report", "reports.nightly", cron="0 3 * * *", timezone="Europe/Paris")
    schedules.pause("nightly-report"); schedules.resume("nightly-report"); schedules.trigger("nightly-report")

Every worker runs the scheduler: due schedules are locked with SKIP LOCKED (PostgreSQL), and a
fire time's run has an id and an idempotency key derived from the schedule and the time, so each
fire time starts exactly one run however many workers race and however they crash.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import uuid
from collections.abc import Callable
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.db import connections, transaction
from django.db.models import QuerySet

from . import clock, conf, ids, registry, serialization, workpool
from .cron import next_after, upcoming  # noqa: F401 - upcoming: part of this module's API (__all__)
from .cron import valid as valid_cron
from .exceptions import DurableError
from .models import Schedule, WorkflowRun
from .workpool.runs import NewRun, create_run, insert_ready, stored_input

logger = logging.getLogger("django_durable.worker")

SLUG = re.compile(r"^[-a-zA-Z0-9_.:]{1,100}$")
TIMING_FIELDS = ("cron", "interval", "timezone")


class ScheduleError(DurableError, ValueError):
    """A schedule's definition is not valid."""


# -- the API --------------------------------------------------------------------------------------


def ensure_schedule(slug: str, workflow: str | Callable, *, cron: str | None = None,
                    interval: float | dt.timedelta | None = None, timezone: str = "UTC", args=(),
                    kwargs: dict | None = None, overlap: str = "allow", catch_up: str = "none",
                    queue: str | None = None, enabled: bool | None = None, declared: bool = False) -> Schedule:
    """Create the schedule `slug`, or bring it in line with this definition; return it.

    Idempotent and safe when many processes call it at once (at boot, say): the slug is
    unique. A changed cron, interval or time zone moves the next fire time. A new schedule
    starts active unless `enabled=False`; an existing one stays active or paused as it is (an
    operator's pause outlives the next deploy) unless `enabled` is given: True resumes it,
    False pauses it. Raise
    ScheduleError naming the bad value, WorkflowNotFound for an unknown workflow, InvalidArguments
    for arguments the workflow does not take.
    """
    definition = _validated(slug, workflow, cron, interval, timezone, overlap, catch_up, queue)
    definition.validated([*args], kwargs or {})  # each fire time would fail on them otherwise
    fields = {
        "workflow": definition.name,
        "args": serialization.encode([*args], what=f"args of schedule {slug!r}"),
        "kwargs": serialization.encode(kwargs or {}, what=f"kwargs of schedule {slug!r}"),
        "cron": cron or "",
        "interval": _seconds(interval),
        "timezone": timezone,
        "overlap": overlap,
        "catch_up": catch_up,
        "queue": queue or "",
        "declared": declared,
    }
    db = conf.get("DATABASE")
    with transaction.atomic(using=db):
        schedule = _locked(slug, db)
        if schedule is None:
            fresh = Schedule(slug=slug, **fields)
            fresh.status = Schedule.Status.PAUSED if enabled is False else Schedule.Status.ACTIVE
            fresh.next_fire_at = next_after(fresh, clock.now())
            # ON CONFLICT DO NOTHING: workers starting together all sync the declared schedules, and
            # a failed INSERT is an ERROR line in PostgreSQL's log for an operator who alerts on them.
            # Whoever inserted it, the row is then locked and brought to this definition below.
            Schedule.objects.using(db).bulk_create([fresh], ignore_conflicts=True)
            schedule = _locked(slug, db)
        changed = {name: value for name, value in fields.items() if getattr(schedule, name) != value}
        wanted = schedule.status if enabled is None else Schedule.Status.ACTIVE if enabled else Schedule.Status.PAUSED
        if changed or schedule.status != wanted:
            for name, value in changed.items():
                setattr(schedule, name, value)
            schedule.status = wanted
            if set(changed) & set(TIMING_FIELDS):
                schedule.next_fire_at = None  # a new interval counts from now, not from the old grid
                schedule.next_fire_at = next_after(schedule, clock.now())
            schedule.updated_at = clock.now()
            schedule.save(using=db)
    return schedule


def get(slug: str) -> Schedule:
    """Return the schedule `slug`; raise Schedule.DoesNotExist."""
    return Schedule.objects.using(conf.get("DATABASE")).get(slug=slug)


def list() -> QuerySet:  # noqa: A001 - the name the seed and the issue use
    """Return every schedule, by slug."""
    return Schedule.objects.using(conf.get("DATABASE")).all()


def pause(slug: str) -> Schedule:
    """Stop the schedule from firing (until resume); return it."""
    return _set_status(slug, Schedule.Status.PAUSED)


def resume(slug: str) -> Schedule:
    """Let the schedule fire again; return it.

    The fire times of the paused period are not replayed, unless its catch-up policy is
    ``latest`` or ``all``, which treat them as missed.
    """
    return _set_status(slug, Schedule.Status.ACTIVE)


def update(slug: str, **changes: Any) -> Schedule:
    """Change some of the schedule's definition (ensure_schedule's arguments); return it."""
    schedule = get(slug)
    current = {
        "cron": schedule.cron or None, "interval": schedule.interval, "timezone": schedule.timezone,
        "args": serialization.decode(schedule.args), "kwargs": serialization.decode(schedule.kwargs),
        "overlap": schedule.overlap, "catch_up": schedule.catch_up, "queue": schedule.queue or None,
        "enabled": schedule.status == Schedule.Status.ACTIVE, "declared": schedule.declared,
    }
    if "cron" in changes and changes["cron"]:
        current["interval"] = None
    if "interval" in changes and changes["interval"]:
        current["cron"] = None
    unknown = set(changes) - set(current) - {"workflow"}
    if unknown:
        raise ScheduleError(f"update() does not know {sorted(unknown)!r}; it takes {sorted(current)!r}.")
    current.update(changes)
    return ensure_schedule(slug, current.pop("workflow", schedule.workflow), **current)


def remove(slug: str) -> bool:
    """Delete the schedule; return whether it existed. Its runs are kept."""
    deleted, _ = Schedule.objects.using(conf.get("DATABASE")).filter(slug=slug).delete()
    return bool(deleted)


def trigger(slug: str) -> WorkflowRun:
    """Start a run of the schedule now, outside its fire times; return it."""
    schedule = get(slug)
    run = create_run(registry.get(schedule.workflow), serialization.decode(schedule.args),
                     serialization.decode(schedule.kwargs), queue=schedule.queue or None)
    Schedule.objects.using(conf.get("DATABASE")).filter(pk=schedule.pk).update(last_run=run)
    return run


# -- the scheduler ----------------------------------------------------------------------------------


def tick(*, db: str, batch: int = 200) -> int:
    """Start the runs of every due fire time of every active schedule; return how many started.

    Schedules are handled `batch` at a time, each batch its own transaction, so the first runs
    are visible to workers while later schedules are still being handled.
    """
    now = clock.database_now(db)
    grace = dt.timedelta(seconds=float(conf.get("SCHEDULE_GRACE_SECONDS")))
    started = 0
    while True:
        count, handled = _tick_batch(db, now, grace, batch)
        started += count
        if handled < batch:
            return started


def _tick_batch(db, now, grace, batch) -> tuple[int, int]:
    with transaction.atomic(using=db):
        due = Schedule.objects.using(db).filter(status=Schedule.Status.ACTIVE, next_fire_at__lte=now)
        if conf.is_postgres(db):
            # Every worker runs this: each takes schedules no other is handling right now (and
            # locks only the schedule rows, not their last runs).
            due = due.select_for_update(skip_locked=True, no_key=True, of=("self",))
        schedules = [*due.select_related("last_run").order_by("next_fire_at")[:batch]]
        starts = []
        for schedule in schedules:
            fire_times = _due_fire_times(schedule, now, grace)
            schedule.next_fire_at = next_after(schedule, max(now, fire_times[-1] if fire_times else now),
                                                previous=fire_times[-1] if fire_times else schedule.last_fire_at)
            if fire_times and schedule.overlap == Schedule.Overlap.SKIP and _unfinished(schedule.last_run):
                logger.info("Schedule %s skipped %d fire time(s): its last run is unfinished.", schedule.slug,
                            len(fire_times))
                fire_times = []
            if fire_times and registry.find(schedule.workflow) is None:
                logger.error("Schedule %s names the workflow %r, which is not registered; %d fire time(s) skipped.",
                             schedule.slug, schedule.workflow, len(fire_times))
                fire_times = []
            for fire_time in fire_times:
                starts.append((schedule, fire_time))
            if fire_times:
                schedule.last_fire_at = fire_times[-1]
                schedule.last_run_id = _run_id(schedule, fire_times[-1])
            schedule.updated_at = now
        started = _start_runs(starts, db) if starts else 0
        _save_progress(schedules, now, db)
    return started, len(schedules)


def _save_progress(schedules: list[Schedule], now: dt.datetime, db: str) -> None:
    """One UPDATE for the whole batch (Django's bulk_update builds a CASE per row: far slower)."""
    if not schedules:
        return
    connection = connections[db]
    pg = conf.is_postgres(db)
    row = "(%s::bigint, %s::timestamptz, %s::timestamptz, %s::uuid)" if pg else "(%s, %s, %s, %s)"
    fields = [Schedule._meta.get_field(name) for name in ("id", "next_fire_at", "last_fire_at", "last_run")]
    params = [now if pg else fields[1].get_db_prep_value(now, connection)]
    for schedule in schedules:
        values = (schedule.pk, schedule.next_fire_at, schedule.last_fire_at, schedule.last_run_id)
        params.extend(f.get_db_prep_value(v, connection) for f, v in zip(fields, values))
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE durable_schedule SET next_fire_at = u.column2, last_fire_at = u.column3, "
            f"last_run_id = u.column4, updated_at = %s FROM (VALUES {', '.join([row] * len(schedules))}) AS u "
            "WHERE durable_schedule.id = u.column1",
            params,
        )


def _due_fire_times(schedule: Schedule, now: dt.datetime, grace: dt.timedelta) -> list[dt.datetime]:
    """The fire times of `schedule` that are due at `now`, after its catch-up policy."""
    times, when = [], schedule.next_fire_at
    limit = int(conf.get("MAX_CATCH_UP"))
    while when is not None and when <= now:
        times.append(when)
        if len(times) > limit:
            times.pop(0)  # keep the latest ones
        when = next_after(schedule, when, previous=when)
    if schedule.catch_up == Schedule.CatchUp.ALL:
        return times
    if schedule.catch_up == Schedule.CatchUp.LATEST:
        return times[-1:]
    return [t for t in times if now - t <= grace]  # missed ones are skipped


def _start_runs(starts: list[tuple[Schedule, dt.datetime]], db: str) -> int:
    """Create the runs of these fire times, each once: their ids are derived from the fire time."""
    ready = []
    for schedule, fire_time in starts:
        definition = registry.get(schedule.workflow)
        run_id = _run_id(schedule, fire_time)
        key = f"schedule:{schedule.slug}:{fire_time.isoformat()}"
        if definition.timeout is not None:  # a deadline needs its timer: the slower, general path
            create_run(definition, serialization.decode(schedule.args), serialization.decode(schedule.kwargs),
                       queue=schedule.queue or None, run_id=run_id, idempotency_key=key)
            continue
        # Checked when the schedule was made; encoded as every run's input (a large one stored apart).
        text = stored_input(definition, serialization.decode(schedule.args), serialization.decode(schedule.kwargs),
                            run_id, validated=True)
        ready.append(NewRun(run_id, definition.name, text,
                            definition.max_attempts, schedule.queue or definition.queue, definition.priority,
                            idempotency_key=key, scheduled_at=fire_time))
    # A fire time another worker (or an earlier attempt) started already is skipped: each starts once.
    insert_ready(ready, db, skip_existing=True, notify=False)
    workpool.notify(db)
    return len(starts)


def next_due_in(*, db: str) -> float | None:
    """Seconds until the next active schedule is due (by the database's clock), or None."""
    from django.db.models import Min

    earliest = Schedule.objects.using(db).filter(status=Schedule.Status.ACTIVE).aggregate(at=Min("next_fire_at"))["at"]
    if earliest is None:
        return None
    now = clock.database_now(db)
    return (earliest - now).total_seconds()


def sync_declared() -> tuple[int, int]:
    """Create or update the schedules declared on workflows; remove declared ones no longer declared.

    Return (kept, removed). Safe to run from many processes at once.
    """
    declared = {d.name: d for d in registry.definitions() if d.schedule}
    for name, definition in declared.items():
        options = dict(definition.schedule) if isinstance(definition.schedule, dict) else {"cron": definition.schedule}
        # A declared schedule an operator paused stays paused: only its definition comes from code.
        options.setdefault("enabled", None)
        ensure_schedule(options.pop("slug", name), name, declared=True, **options)
    stale = Schedule.objects.using(conf.get("DATABASE")).filter(declared=True).exclude(workflow__in=declared)
    removed, _ = stale.delete()
    return len(declared), removed


# -- helpers ----------------------------------------------------------------------------------------


def _validated(slug, workflow, cron, interval, timezone, overlap, catch_up, queue):
    if not isinstance(slug, str) or not SLUG.match(slug):
        raise ScheduleError(f"Schedule slug {slug!r} is not valid: use 1 to 100 letters, digits, '-', '_', '.', ':'.")
    definition = registry.get(workflow)
    if cron and interval is not None:
        raise ScheduleError(f"Schedule {slug!r} has both cron={cron!r} and interval={interval!r}; give one.")
    if not cron and interval is None:
        raise ScheduleError(f"Schedule {slug!r} needs cron= or interval=.")
    if cron and not valid_cron(cron):
        raise ScheduleError(
            f"Schedule {slug!r} has cron={cron!r}, which is not a valid five-field cron expression "
            f"(minute hour day-of-month month day-of-week, e.g. '0 3 * * mon-fri')."
        )
    if interval is not None and (_seconds(interval) is None or _seconds(interval) <= 0):
        raise ScheduleError(f"Schedule {slug!r} has interval={interval!r}; it must be a positive number of seconds.")
    try:
        ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise ScheduleError(f"Schedule {slug!r} has timezone={timezone!r}, which is not a known time zone.") from None
    if overlap not in Schedule.Overlap.values:
        raise ScheduleError(f"Schedule {slug!r} has overlap={overlap!r}; use one of {Schedule.Overlap.values}.")
    if catch_up not in Schedule.CatchUp.values:
        raise ScheduleError(f"Schedule {slug!r} has catch_up={catch_up!r}; use one of {Schedule.CatchUp.values}.")
    if queue is not None and (not isinstance(queue, str) or not 0 < len(queue) <= 100):
        raise ScheduleError(f"Schedule {slug!r} has queue={queue!r}; use a name of 1 to 100 characters.")
    return definition


def _seconds(interval) -> float | None:
    if interval is None:
        return None
    if isinstance(interval, dt.timedelta):
        return interval.total_seconds()
    if isinstance(interval, bool) or not isinstance(interval, (int, float)):
        return None
    return float(interval)


def _run_id(schedule: Schedule, fire_time: dt.datetime) -> uuid.UUID:
    return ids.scheduled_id(schedule.slug, fire_time)


def _unfinished(run: WorkflowRun | None) -> bool:
    return run is not None and run.status not in WorkflowRun.TERMINAL


def _locked(slug: str, db: str) -> Schedule | None:
    return Schedule.objects.using(db).select_for_update().filter(slug=slug).first()


def _set_status(slug: str, status: str) -> Schedule:
    db = conf.get("DATABASE")
    with transaction.atomic(using=db):
        schedule = _locked(slug, db)
        if schedule is None:
            raise Schedule.DoesNotExist(f"No schedule has the slug {slug!r}.")
        resuming = status == Schedule.Status.ACTIVE and schedule.status != status
        schedule.status = status
        if resuming and schedule.catch_up == Schedule.CatchUp.NONE:
            schedule.next_fire_at = next_after(schedule, clock.now())
        schedule.save(using=db, update_fields=["status", "next_fire_at"])
    return schedule


__all__ = [
    "ScheduleError", "ensure_schedule", "get", "list", "pause", "remove", "resume", "sync_declared", "trigger",
    "update", "upcoming",
]