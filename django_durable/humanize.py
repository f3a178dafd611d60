"""Times, durations and schedules in words, for the admin, the API and the command line."""

from __future__ import annotations

import datetime as dt

from django.utils import timezone


def duration(seconds: float | None) -> str:
    """850 ms, 12.3 s, 4 min 5 s, 3 h 12 min, 2 d 4 h."""
    if seconds is None:
        return ""
    seconds = max(0.0, seconds)
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def relative(when: dt.datetime | None, now: dt.datetime | None = None) -> str:
    """'in 3 h', '5 min ago', 'now'."""
    if when is None:
        return ""
    delta = (when - (now or timezone.now())).total_seconds()
    if abs(delta) < 1:
        return "now"
    return f"in {duration(delta)}" if delta > 0 else f"{duration(-delta)} ago"


def between(start: dt.datetime | None, end: dt.datetime | None) -> float | None:
    if start is None:
        return None
    return ((end or timezone.now()) - start).total_seconds()


def humanize_interval(seconds: float | None) -> str:
    if not seconds:
        return ""
    return f"every {duration(seconds)}"


_DAYS = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"]
_DAY_NAMES = {name[:3].lower(): i for i, name in enumerate(_DAYS)}
_MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December"]
_MONTH_NAMES = {name[:3].lower(): i + 1 for i, name in enumerate(_MONTHS)}


def describe_cron(expression: str) -> str:
    """A sentence for the common cron shapes ('every day at 03:00'); the expression itself otherwise."""
    fields = expression.split()
    if len(fields) != 5:
        return expression
    minute, hour, dom, month, dow = fields
    try:
        if (hour, dom, month, dow) == ("*", "*", "*", "*"):
            if minute == "*":
                return "every minute"
            if minute.startswith("*/"):
                return f"every {int(minute[2:])} minutes"
            return f"every hour at minute {int(minute)}"
        if dom == "*" and month == "*" and hour.startswith("*/") and minute.isdigit():
            return f"every {int(hour[2:])} hours at minute {int(minute)}"
        if not (minute.isdigit() and hour.isdigit()):
            return expression
        at = f"at {int(hour):02d}:{int(minute):02d}"
        if (dom, month, dow) == ("*", "*", "*"):
            return f"every day {at}"
        if dom == "*" and month == "*":
            return f"{at} on {_days(dow)}"
        if month == "*" and dow == "*" and dom.isdigit():
            return f"{at} on day {int(dom)} of every month"
        if dow == "*" and dom.isdigit():
            return f"{at} on {_month(month)} {int(dom)} every year"
    except (ValueError, IndexError, KeyError):
        pass
    return expression


def _day(token: str) -> str:
    token = token.lower()
    index = _DAY_NAMES[token[:3]] if token[:3] in _DAY_NAMES else int(token) % 7
    return _DAYS[index]


def _days(field: str) -> str:
    parts = []
    for part in field.split(","):
        if "-" in part:
            first, last = part.split("-")
            parts.append(f"{_day(first)} to {_day(last)}")
        else:
            parts.append(_day(part))
    return " and ".join(parts) if len(parts) <= 2 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _month(token: str) -> str:
    token = token.lower()
    return _MONTHS[(_MONTH_NAMES[token[:3]] if token[:3] in _MONTH_NAMES else int(token)) - 1]


def short_id(pk) -> str:
    """The last 8 hex digits of a run's id, as the admin, the example and the command line show
    it: a UUIDv7 starts with the clock, so its end tells the runs of a minute apart."""
    return str(pk).replace("-", "")[-8:]


def one_line(exc: BaseException, limit: int = 500) -> str:
    """'Type: message' on one line: a log line per event, however many lines a driver's message has."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:limit]}"
