"""A journal in time partitions (PostgreSQL, optional): old history leaves by DROP, not DELETE.

The journal (durable_step) is most of the rows a busy installation keeps, ten or more per run.
Pruned row by row, every one leaves a dead tuple for VACUUM. Partitioned by the time its run was
created (``Step.run_created_at``, the same for every entry of a run, so the unique (run, key,
run_created_at) is the unique (run, key) that keeps a step from being recorded twice), a month of
journal goes with one DROP once none of that month's runs is left.

- ``PartitionJournal``, a migration operation in a project's own migration, turns the plain table
  into the partitioned one without rewriting it: the existing table becomes the partition of
  everything before the conversion (its rows keep run_created_at = 1970, a default that cost no
  rewrite), and partitions for the coming intervals are made.
- Once converted, the engine writes each entry's partition key (the run's creation time, or 1970
  for the runs created before the conversion) and looks up a run's entries in its own partition.
- ``maintain()`` (``manage.py durable partitions``, every worker's start-up and the built-in
  ``durable.prune``) makes the partitions ahead, drops those whose runs are all gone, and ANALYZEs
  the parent (autovacuum never does: it analyzes the partitions, not the partitioned table).
- The prune then deletes the runs and leaves their journal entries to the DROP; only the entries of
  runs from before the conversion are deleted with their run, as before.

The runs table itself is not partitioned: its unique rules (an idempotency key, one unfinished run
per subject) hold across all time, and PostgreSQL keeps a unique index of a partitioned table only
within each partition. See docs/scaling.md.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass

from django.db import connections, transaction
from django.db.migrations.operations.base import Operation

from . import clock, conf
from .models import EPOCH

TABLE = "durable_step"
INTERVALS = ("day", "week", "month")
# The lower bound of a partition as PostgreSQL prints it: FROM ('2026-11-01 00:00:00+00') or MINVALUE.
_BOUND = re.compile(r"FROM \((MINVALUE|'[^']+')\) TO \((MAXVALUE|'[^']+')\)")


@dataclass(frozen=True)
class Layout:
    """How the journal is partitioned: `since` the conversion, in partitions of one `interval`."""

    since: dt.datetime
    interval: str

    def key_sql(self, run: str) -> str:
        """SQL for the partition key of the entries of run `run` (an alias of durable_workflow_run)."""
        return (f"CASE WHEN {run}.created_at >= '{self.since.isoformat()}'::timestamptz THEN {run}.created_at "
                f"ELSE '{EPOCH.isoformat()}'::timestamptz END")

    def key(self, created_at: dt.datetime) -> dt.datetime:
        return created_at if created_at >= self.since else EPOCH


@dataclass(frozen=True)
class Partition:
    name: str
    start: dt.datetime | None  # None: from the beginning (the table as it was before the conversion)
    end: dt.datetime
    rows: int  # the planner's estimate


_layouts: dict[str, Layout | None] = {}


def layout(db: str | None = None, *, refresh: bool = False) -> Layout | None:
    """How the journal on `db` (the durable database) is partitioned, or None: a plain table, or
    not PostgreSQL. Read once per process (restart the workers after converting)."""
    db = db or conf.get("DATABASE")
    if refresh or db not in _layouts:
        _layouts[db] = _read_layout(db)
    return _layouts[db]


def _read_layout(db: str) -> Layout | None:
    connection = connections[db]
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT c.relkind, obj_description(c.oid, 'pg_class') FROM pg_class AS c "
                       "WHERE c.oid = to_regclass(%s)", [TABLE])
        row = cursor.fetchone()
    if row is None or row[0] != "p":
        return None
    described = json.loads(row[1] or "{}")
    return Layout(since=dt.datetime.fromisoformat(described["since"]), interval=described["interval"])


def entry_fields(run_id, db: str) -> dict:
    """The partition key of run `run_id`'s entries as a Step field, for a journal entry made with
    the ORM (nothing where the journal is a plain table)."""
    shape = layout(db)
    if shape is None:
        return {}
    from .models import WorkflowRun

    created_at = WorkflowRun.objects.using(db).filter(pk=run_id).values_list("created_at", flat=True).first()
    return {"run_created_at": EPOCH if created_at is None else shape.key(created_at)}


# -- intervals ------------------------------------------------------------------------------------


def _floor(moment: dt.datetime, interval: str) -> dt.datetime:
    day = dt.datetime(moment.year, moment.month, moment.day, tzinfo=dt.timezone.utc)
    if interval == "day":
        return day
    if interval == "week":
        return day - dt.timedelta(days=day.weekday())
    return day.replace(day=1)


def _next(moment: dt.datetime, interval: str) -> dt.datetime:
    if interval == "day":
        return moment + dt.timedelta(days=1)
    if interval == "week":
        return moment + dt.timedelta(days=7)
    return (moment + dt.timedelta(days=32)).replace(day=1)


def _name(start: dt.datetime) -> str:
    return f"{TABLE}_p{start:%Y%m%d}"


# -- the conversion -------------------------------------------------------------------------------


def _check_interval(interval: str) -> None:
    if interval not in INTERVALS:
        raise ValueError(f"interval must be one of {', '.join(INTERVALS)}, not {interval!r}.")


def convert(db: str, interval: str = "month", ahead: int = 3, *, since: dt.datetime | None = None) -> Layout:
    """Partition the plain journal on `db` (see PartitionJournal); return its layout.

    Outside a transaction (a migration with ``atomic = False``), the index the partitions need is
    built CONCURRENTLY first, so writes go on while it is made; inside one, it is built plainly
    (right for a small table). The swap itself is one short transaction. `since`, an earlier
    moment the time partitions begin at, is for an empty journal only (a benchmark's history).
    """
    _check_interval(interval)
    if not isinstance(ahead, int) or ahead < 1:
        raise ValueError(f"ahead must be a whole number of intervals, at least 1, not {ahead!r}.")
    connection = connections[db]
    if connection.vendor != "postgresql":
        raise NotImplementedError("Only a journal on PostgreSQL can be partitioned.")
    current = _read_layout(db)
    if current is not None:
        return current
    concurrently = "CONCURRENTLY " if not connection.in_atomic_block else ""
    with connection.cursor() as cursor:
        # The unique index every partition needs (the partition key is part of it), built on the
        # table as it is; the partitioned parent's own index then adopts it instead of building one.
        cursor.execute(f"CREATE UNIQUE INDEX {concurrently}IF NOT EXISTS durable_step_run_key_created "
                       f"ON {TABLE} (run_id, key, run_created_at)")
        with transaction.atomic(using=db):
            if since is None:
                cursor.execute("SELECT date_trunc('second', statement_timestamp())")
                since = cursor.fetchone()[0].astimezone(dt.timezone.utc)
            else:
                cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {TABLE})")
                if cursor.fetchone()[0]:
                    raise ValueError("An earlier `since` is for an empty journal only.")
            before = f"{TABLE}_before_{since:%Y%m%d}"
            # Every entry there is of a run from before: checked once (a scan, writes go on), and
            # then the attach below needs no scan of its own.
            cursor.execute(f"ALTER TABLE {TABLE} ADD CONSTRAINT {before}_range "
                           f"CHECK (run_created_at < %s) NOT VALID", [since])
            cursor.execute(f"ALTER TABLE {TABLE} VALIDATE CONSTRAINT {before}_range")
            cursor.execute(f"SELECT coalesce(max(id), 0) + 1 FROM {TABLE}")
            next_id = cursor.fetchone()[0]
            cursor.execute(f"LOCK TABLE {TABLE} IN ACCESS EXCLUSIVE MODE")
            cursor.execute(f"ALTER TABLE {TABLE} ALTER COLUMN id DROP IDENTITY IF EXISTS")
            cursor.execute(f"ALTER TABLE {TABLE} RENAME TO {before}")
            cursor.execute(f"CREATE TABLE {TABLE} (LIKE {before} INCLUDING DEFAULTS) PARTITION BY RANGE (run_created_at)")
            cursor.execute(f"CREATE SEQUENCE {TABLE}_id_seq START %s OWNED BY {TABLE}.id", [next_id])
            cursor.execute(f"ALTER TABLE {TABLE} ALTER COLUMN id SET DEFAULT nextval('{TABLE}_id_seq')")
            cursor.execute(f"ALTER TABLE {TABLE} ATTACH PARTITION {before} FOR VALUES FROM (MINVALUE) TO (%s)", [since])
            # The parent's indexes, each adopting the equivalent one the old table has.
            cursor.execute(f"CREATE UNIQUE INDEX durable_step_journal ON {TABLE} (run_id, key, run_created_at)")
            cursor.execute(f"CREATE INDEX durable_step_event_waiting ON {TABLE} (name) "
                           "WHERE kind = 'event' AND status = 'waiting'")
            # A worker started before the conversion writes 1970 as every entry's key, which puts
            # it here: refused for a run created since, so that no run has entries under two keys.
            cursor.execute(f"""
                CREATE OR REPLACE FUNCTION durable_step_refuse_stale_writer() RETURNS trigger AS $$
                BEGIN
                    IF EXISTS (SELECT 1 FROM durable_workflow_run
                               WHERE id = NEW.run_id AND created_at >= '{since.isoformat()}'::timestamptz) THEN
                        RAISE EXCEPTION 'The journal (durable_step) is partitioned since %: restart this '
                            'process (a durable worker started before that writes entries without their '
                            'partition key).', '{since.isoformat()}';
                    END IF;
                    RETURN NEW;
                END $$ LANGUAGE plpgsql""")
            cursor.execute(f"CREATE TRIGGER refuse_stale_writer BEFORE INSERT ON {before} "
                           "FOR EACH ROW EXECUTE FUNCTION durable_step_refuse_stale_writer()")
            shape = Layout(since=since, interval=interval)
            cursor.execute(f"COMMENT ON TABLE {TABLE} IS %s",
                           [json.dumps({"since": since.isoformat(), "interval": interval})])
            end = _next(_floor(since, interval), interval)
            cursor.execute(f"CREATE TABLE {_name(since)} PARTITION OF {TABLE} FOR VALUES FROM (%s) TO (%s)", [since, end])
        _layouts[db] = shape
    ensure_ahead(db, ahead)
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {TABLE}")
    return shape


class PartitionJournal(Operation):
    """Partition the journal by time on PostgreSQL; nothing elsewhere. In a project's migration:

        class Migration(migrations.Migration):
            atomic = False  # the index is then built without blocking writes
            dependencies = [("django_durable", "0019_journal_partition_key")]
            operations = [PartitionJournal(interval="month", ahead=3)]

    Not reversible: going back would copy the whole journal. Stop the workers (or restart them
    right after): one started before the conversion is refused its writes of runs created since.
    """

    reversible = False
    reduces_to_sql = False

    def __init__(self, interval: str = "month", ahead: int = 3):
        _check_interval(interval)
        self.interval, self.ahead = interval, ahead

    def deconstruct(self):
        return self.__class__.__name__, [], {"interval": self.interval, "ahead": self.ahead}

    def state_forwards(self, app_label, state):
        pass  # the models do not change: the same columns, on a partitioned table

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        connection = schema_editor.connection
        if connection.vendor != "postgresql" or connection.alias != conf.get("DATABASE"):
            return
        convert(connection.alias, self.interval, self.ahead)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        raise NotImplementedError("A partitioned journal is not turned back into a plain table by a migration.")

    def describe(self):
        return f"Partition the durable journal by {self.interval}"

    @property
    def migration_name_fragment(self):
        return "partition_journal"


# -- upkeep ---------------------------------------------------------------------------------------


def partitions(db: str | None = None) -> list[Partition]:
    """The journal's partitions, oldest first (none for a plain table)."""
    db = db or conf.get("DATABASE")
    if layout(db) is None:
        return []
    with connections[db].cursor() as cursor:
        cursor.execute("SELECT c.relname, pg_get_expr(c.relpartbound, c.oid), c.reltuples::bigint "
                       "FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid "
                       "WHERE i.inhparent = to_regclass(%s)", [TABLE])
        rows = cursor.fetchall()
    found = []
    for name, bound, estimate in rows:
        start, end = _BOUND.search(bound).groups()
        found.append(Partition(name, None if start == "MINVALUE" else _moment(start), _moment(end), max(estimate, 0)))
    return sorted(found, key=lambda p: p.end)


def _moment(text: str) -> dt.datetime:
    moment = dt.datetime.fromisoformat(text.strip("'"))
    return moment.astimezone(dt.timezone.utc)


def ensure_ahead(db: str | None = None, ahead: int = 3) -> list[str]:
    """Make the partitions of the current interval and the `ahead` next; return the names of those made."""
    db = db or conf.get("DATABASE")
    shape = layout(db)
    if shape is None:
        return []
    existing = partitions(db)
    last = existing[-1].end if existing else shape.since
    horizon = _floor(clock.database_now(db).astimezone(dt.timezone.utc), shape.interval)
    for _ in range(ahead + 1):  # the current interval and `ahead` more
        horizon = _next(horizon, shape.interval)
    made = []
    while last < horizon:
        end = _next(_floor(last, shape.interval), shape.interval)
        with connections[db].cursor() as cursor:
            cursor.execute(f"CREATE TABLE IF NOT EXISTS {_name(last)} PARTITION OF {TABLE} "
                           "FOR VALUES FROM (%s) TO (%s)", [last, end])
        made.append(_name(last))
        last = end
    return made


def droppable(db: str | None = None, margin: dt.timedelta = dt.timedelta(hours=1),
              now: dt.datetime | None = None) -> list[Partition]:
    """The partitions past (ended `margin` before now, the database's clock unless given) none of
    whose runs is left."""
    from .models import WorkflowRun

    db = db or conf.get("DATABASE")
    now = now or clock.database_now(db)
    found = []
    for partition in partitions(db):
        if partition.end > now - margin:
            continue
        runs = WorkflowRun.objects.using(db).filter(created_at__lt=partition.end)
        if partition.start is not None:
            runs = runs.filter(created_at__gte=partition.start)
        if not runs.exists():
            found.append(partition)
    return found


def drop(partition: Partition, db: str | None = None) -> None:
    """Detach `partition` without blocking the journal (CONCURRENTLY), then drop it."""
    db = db or conf.get("DATABASE")
    connection = connections[db]
    with connection.cursor() as cursor:
        if connection.in_atomic_block:  # CONCURRENTLY cannot run in a transaction
            cursor.execute(f"ALTER TABLE {TABLE} DETACH PARTITION {partition.name}")
        else:
            cursor.execute(f"ALTER TABLE {TABLE} DETACH PARTITION {partition.name} CONCURRENTLY")
        cursor.execute(f"DROP TABLE {partition.name}")


def maintain(db: str | None = None, ahead: int = 3, drop_empty: bool = True, now: dt.datetime | None = None) -> dict:
    """Make partitions ahead, drop the empty past ones, ANALYZE the parent; what was done. (`now`
    moves the clock droppable() judges by: for tests.)"""
    db = db or conf.get("DATABASE")
    if layout(db) is None:
        return {"made": [], "dropped": []}
    made = ensure_ahead(db, ahead)
    dropped = []
    if drop_empty:
        for partition in droppable(db, now=now):
            drop(partition, db)
            dropped.append(partition.name)
    with connections[db].cursor() as cursor:
        cursor.execute(f"ANALYZE {TABLE}")
    return {"made": made, "dropped": dropped}


def delete_runs(runs, db: str) -> tuple[int, dict]:
    """Delete `runs` (a queryset) as QuerySet.delete() does; where the journal is partitioned, except
    their entries in time partitions, which the DROP of their partition takes (those from before
    the conversion go with their run: the old table keeps its foreign key)."""
    from django.db.models.deletion import Collector

    from .models import Step

    if layout(db) is None:
        return runs.delete()
    with transaction.atomic(using=db):
        collector = Collector(using=db, origin=runs)
        collector.collect(runs)
        entries = [query for query in collector.fast_deletes if query.model is Step]
        collector.fast_deletes = [query for query in collector.fast_deletes if query.model is not Step]
        instances = collector.data.pop(Step, set())
        for query in entries:
            query.filter(run_created_at=EPOCH)._raw_delete(db)
        before = [s.run_id for s in instances if s.run_created_at == EPOCH]
        if before:
            Step.objects.using(db).filter(run_id__in=before, run_created_at=EPOCH)._raw_delete(db)
        return collector.delete()
