"""The one clock: every time the engine acts on comes from here.

In production, leases, timers and timestamps are the database's time (``now()`` in SQL), so a
worker with a wrong clock cannot expire a lease early or fire a timer early. Tests may freeze the
clock (``django_durable.testing``); then the frozen value is sent to the database instead.
"""

from __future__ import annotations

import datetime as dt
import math

from django.db.models import DateTimeField, Value
from django.db.models.functions import Now
from django.utils import timezone

_frozen: dt.datetime | None = None


def seconds(value, what: str, *, zero: bool = True) -> float:
    """`value`, a number of seconds or a timedelta, in seconds; a ValueError naming `what` if it is
    neither, not finite, negative, or (unless `zero`) zero."""
    if isinstance(value, dt.timedelta):
        value = value.total_seconds()
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0
            or (value == 0 and not zero)):
        raise ValueError(f"{what} must be a number of seconds or a timedelta {'>= 0' if zero else '> 0'}, "
                         f"not {value!r}.")
    return float(value)


def now() -> dt.datetime:
    """Return the current time on the worker (or the frozen test time), aware, in UTC."""
    return _frozen if _frozen is not None else timezone.now()


def database_now(db: str) -> dt.datetime:
    """Return the database's clock now (one query on PostgreSQL), or the frozen test time.

    For times computed outside a worker's claim, such as the start of a delayed run: a web
    server with a wrong clock must not move them.
    """
    from django.db import connections

    from . import conf

    if _frozen is not None or not conf.is_postgres(db):
        return now()  # SQLite's clock is this machine's
    with connections[db].cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        return cursor.fetchone()[0]


def is_frozen() -> bool:
    return _frozen is not None


def db_now():
    """Return an ORM expression for "now": the database's clock, or the frozen test time."""
    if _frozen is not None:
        return Value(_frozen, output_field=DateTimeField())
    return Now()


def now_sql(vendor: str) -> str:
    """Return SQL for "now" on `vendor`, for hand-written statements.

    A frozen test time is written as a literal: it is a datetime this module formatted, never
    user input.
    """
    if _frozen is not None:
        if vendor == "postgresql":
            return f"'{_frozen.isoformat()}'::timestamptz"
        return f"'{_sqlite_text(_frozen)}'"
    if vendor == "postgresql":
        return "statement_timestamp()"  # what Django's Now() uses on PostgreSQL
    # The format Django's SQLite backend stores datetimes in, so comparisons stay textual.
    return "STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')"


def _sqlite_text(value: dt.datetime) -> str:
    return value.astimezone(dt.timezone.utc).replace(tzinfo=None).isoformat(" ")


def freeze(value: dt.datetime | None) -> None:
    """Freeze the clock at `value` (aware), or unfreeze it with None. For tests."""
    global _frozen
    if value is not None and timezone.is_naive(value):
        raise ValueError(f"The test clock needs an aware datetime, not {value!r}.")
    _frozen = value
