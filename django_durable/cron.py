"""Fire times: when a schedule (a cron expression or a fixed interval, in a time zone) fires next.

Arithmetic only, croniter's, on a schedule's fields: no database. Schedule.next_runs() and the
scheduler (schedules.py) both ask it.
"""

from __future__ import annotations

import datetime as dt
import functools
from zoneinfo import ZoneInfo

from . import clock


def valid(expression) -> bool:
    """Whether `expression` is a five-field cron expression croniter accepts."""
    if not (isinstance(expression, str) and len(expression.split()) == 5):
        return False
    from croniter import croniter  # imported where used, not in every process's start (10 ms here)

    return croniter.is_valid(expression)


def upcoming(schedule, count: int = 5) -> list[dt.datetime]:
    """The next `count` fire times of `schedule` from its next one, in its time zone."""
    zone = ZoneInfo(schedule.timezone)
    when = schedule.next_fire_at or next_after(schedule, clock.now())
    times = []
    while when is not None and len(times) < count:
        times.append(when.astimezone(zone))
        when = next_after(schedule, when, previous=when)
    return times


def next_after(schedule, after: dt.datetime, previous: dt.datetime | None = None) -> dt.datetime | None:
    """The first fire time strictly after `after` (aware, UTC); never the wall-clock time of `previous` again."""
    if schedule.interval:
        # Fixed intervals count from the schedule's last fire time (or its creation).
        anchor = schedule.next_fire_at or after
        step = dt.timedelta(seconds=schedule.interval)
        if anchor > after:
            return anchor
        missed = int((after - anchor) / step) + 1
        return anchor + missed * step
    return _next_cron(schedule.cron, schedule.timezone, after, previous)


@functools.lru_cache(maxsize=4096)
def _next_cron(cron: str, timezone: str, after: dt.datetime, previous: dt.datetime | None) -> dt.datetime:
    # Cached: a thousand schedules on the same expression ask the same question every minute.
    from croniter import croniter

    zone = ZoneInfo(timezone)
    times = croniter(cron, after.astimezone(zone))
    repeated = {after.astimezone(zone).replace(tzinfo=None)}
    if previous is not None:
        repeated.add(previous.astimezone(zone).replace(tzinfo=None))
    when = times.get_next(dt.datetime)
    # On the day the clock goes back, a wall-clock time happens twice: fire at the first only.
    while when.replace(tzinfo=None) in repeated:
        when = times.get_next(dt.datetime)
    return when.astimezone(dt.timezone.utc)
