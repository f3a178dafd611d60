"""What the partitioned tables share: their intervals, the layout each keeps in its comment, and
listing, making and dropping their partitions."""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass

from django.db import connections, transaction
from django.db.migrations.operations.base import Operation

from .. import clock, conf
from ..ids import EPOCH

INTERVALS = ("day", "week", "month")
# The bounds of a partition as PostgreSQL prints them: FROM ('2026-11-01 00:00:00+00') or MINVALUE.
_BOUND = re.compile(r"FROM \((MINVALUE|'[^']+')\) TO \((MAXVALUE|'[^']+')\)")


@dataclass(frozen=True)
class Layout:
    """How a table is partitioned: `since` the conversion, in partitions of one `interval`."""

    since: dt.datetime
    interval: str


@dataclass(frozen=True)
class Partition:
    name: str
    start: dt.datetime | None  # None: from the beginning (the table as it was before the conversion)
    end: dt.datetime
    rows: int  # the planner's estimate


def check_interval(interval: str) -> None:
    if interval not in INTERVALS:
        raise ValueError(f"interval must be one of {', '.join(INTERVALS)}, not {interval!r}.")


def check_ahead(ahead) -> None:
    if not isinstance(ahead, int) or isinstance(ahead, bool) or ahead < 1:
        raise ValueError(f"ahead must be a whole number of intervals, at least 1, not {ahead!r}.")


def read_layout(db: str, table: str) -> tuple[dt.datetime, str] | None:
    """(since, interval) of `table` on `db` if it is partitioned by a conversion of ours, else None."""
    connection = connections[db]
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT c.relkind, obj_description(c.oid, 'pg_class') FROM pg_class AS c "
                       "WHERE c.oid = to_regclass(%s)", [table])
        row = cursor.fetchone()
    if row is None or row[0] != "p":
        return None
    described = json.loads(row[1] or "{}")
    return dt.datetime.fromisoformat(described["since"]), described["interval"]


def describe(cursor, table: str, since: dt.datetime, interval: str) -> None:
    """Write `table`'s layout in its comment, where read_layout() finds it."""
    cursor.execute(f"COMMENT ON TABLE {table} IS %s", [json.dumps({"since": since.isoformat(), "interval": interval})])


def check_before(db: str, cursor, table: str, column: str) -> None:
    """Check once that every row of `table` has the key 1970 in `column` (the partition before):
    a CHECK added NOT VALID (a moment's lock), then validated by a scan while writes go on (in a
    transaction of its own where the conversion is not in one), so that attaching the table as
    the partition before needs no scan with the table locked."""
    name = f"{table}_before_key"
    with transaction.atomic(using=db):
        cursor.execute(f"ALTER TABLE {table} DROP CONSTRAINT IF EXISTS {name}")
        cursor.execute(f"ALTER TABLE {table} ADD CONSTRAINT {name} CHECK ({column} = %s) NOT VALID", [EPOCH])
    cursor.execute(f"ALTER TABLE {table} VALIDATE CONSTRAINT {name}")


def conversion_time(cursor, table: str, since: dt.datetime | None, latest: dt.datetime | None = None) -> dt.datetime:
    """When a conversion of `table` begins its time partitions: the next whole second after both
    the database's clock and `latest`, the latest time a row there already carries; or an earlier
    `since`, for an empty table (a benchmark's history).

    Called with the table locked, so no row comes meanwhile: every row from before falls before
    the result, as the key 1970 it keeps says. (Rounded down, a run made in the second before the
    conversion would have been looked up in a partition it is not in.)
    """
    if since is None:
        cursor.execute("SELECT date_trunc('second', greatest(statement_timestamp(), %s::timestamptz)) "
                       "+ interval '1 second'", [latest])
        return cursor.fetchone()[0].astimezone(dt.timezone.utc)
    cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {table})")
    if cursor.fetchone()[0]:
        raise ValueError(f"An earlier `since` is for an empty table only ({table} has rows).")
    return since


# -- intervals ------------------------------------------------------------------------------------


def floor(moment: dt.datetime, interval: str) -> dt.datetime:
    day = dt.datetime(moment.year, moment.month, moment.day, tzinfo=dt.timezone.utc)
    if interval == "day":
        return day
    if interval == "week":
        return day - dt.timedelta(days=day.weekday())
    return day.replace(day=1)


def following(moment: dt.datetime, interval: str) -> dt.datetime:
    if interval == "day":
        return moment + dt.timedelta(days=1)
    if interval == "week":
        return moment + dt.timedelta(days=7)
    return (moment + dt.timedelta(days=32)).replace(day=1)


def longest(interval: str) -> dt.timedelta:
    """The longest one `interval` lasts."""
    return {"day": dt.timedelta(days=1), "week": dt.timedelta(days=7), "month": dt.timedelta(days=31)}[interval]


def partition_name(table: str, start: dt.datetime) -> str:
    return f"{table}_p{start:%Y%m%d}"


# -- partitions -----------------------------------------------------------------------------------


def partitions(db: str, table: str) -> list[Partition]:
    """`table`'s partitions, oldest first."""
    with connections[db].cursor() as cursor:
        cursor.execute("SELECT c.relname, pg_get_expr(c.relpartbound, c.oid), c.reltuples::bigint "
                       "FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid "
                       "WHERE i.inhparent = to_regclass(%s)", [table])
        rows = cursor.fetchall()
    found = []
    for name, bound, estimate in rows:
        start, end = _BOUND.search(bound).groups()
        found.append(Partition(name, None if start == "MINVALUE" else _moment(start), _moment(end), max(estimate, 0)))
    return sorted(found, key=lambda p: p.end)


def _moment(text: str) -> dt.datetime:
    moment = dt.datetime.fromisoformat(text.strip("'"))
    return moment.astimezone(dt.timezone.utc)


def first_partition(cursor, table: str, since: dt.datetime, interval: str) -> None:
    """The partition from the conversion to the end of its interval."""
    cursor.execute(f"CREATE TABLE {partition_name(table, since)} PARTITION OF {table} FOR VALUES FROM (%s) TO (%s)",
                   [since, following(floor(since, interval), interval)])


def ensure_ahead(db: str, table: str, shape: Layout, ahead: int) -> list[str]:
    """Make `table`'s partitions of the current interval and the `ahead` next; return the names made."""
    existing = partitions(db, table)
    last = existing[-1].end if existing else shape.since
    horizon = floor(clock.database_now(db).astimezone(dt.timezone.utc), shape.interval)
    for _ in range(ahead + 1):  # the current interval and `ahead` more
        horizon = following(horizon, shape.interval)
    made = []
    while last < horizon:
        end = following(floor(last, shape.interval), shape.interval)
        with connections[db].cursor() as cursor:
            cursor.execute(f"CREATE TABLE IF NOT EXISTS {partition_name(table, last)} PARTITION OF {table} "
                           "FOR VALUES FROM (%s) TO (%s)", [last, end])
        made.append(partition_name(table, last))
        last = end
    return made


def drop(db: str, table: str, partition: Partition) -> None:
    """Detach `partition` of `table` without blocking it (CONCURRENTLY), then drop it."""
    connection = connections[db]
    with connection.cursor() as cursor:
        if connection.in_atomic_block:  # CONCURRENTLY cannot run in a transaction
            cursor.execute(f"ALTER TABLE {table} DETACH PARTITION {partition.name}")
        else:
            cursor.execute(f"ALTER TABLE {table} DETACH PARTITION {partition.name} CONCURRENTLY")
        cursor.execute(f"DROP TABLE {partition.name}")


def analyze(db: str, table: str) -> None:
    """ANALYZE the partitioned parent: autovacuum analyzes its partitions, never the parent itself."""
    with connections[db].cursor() as cursor:
        cursor.execute(f"ANALYZE {table}")


class PartitionOperation(Operation):
    """A migration operation that partitions one durable table by time on PostgreSQL, and does
    nothing elsewhere (or for another database than DURABLE_DATABASE). Not reversible: going
    back would copy the whole table."""

    reversible = False
    reduces_to_sql = False
    what = ""  # "journal", "runs": the table, as its messages and its migration's name say it

    @staticmethod
    def convert(db: str, interval: str, ahead: int):
        raise NotImplementedError

    def __init__(self, interval: str = "month", ahead: int = 3):
        check_interval(interval)
        check_ahead(ahead)
        self.interval, self.ahead = interval, ahead

    def deconstruct(self):
        return self.__class__.__name__, [], {"interval": self.interval, "ahead": self.ahead}

    def state_forwards(self, app_label, state):
        pass  # the models do not change: the same columns, on a partitioned table

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        connection = schema_editor.connection
        if connection.vendor != "postgresql" or connection.alias != conf.get("DATABASE"):
            return
        self.convert(connection.alias, self.interval, self.ahead)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        raise NotImplementedError(f"A partitioned {self.what} is not turned back into a plain table by a migration.")

    def describe(self):
        return f"Partition the durable {self.what} by {self.interval}"

    @property
    def migration_name_fragment(self):
        return f"partition_{self.what}"
