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

The runs table can be partitioned too, once the journal is (runs.py).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.db import connections, transaction

from .. import clock, conf
from ..ids import EPOCH
from . import tables
from .tables import Partition

TABLE = "durable_step"


@dataclass(frozen=True)
class Layout(tables.Layout):
    """How the journal is partitioned; its entries' partition key is their run's creation time."""

    def key_sql(self, run: str) -> str:
        """SQL for the partition key of the entries of run `run` (an alias of durable_workflow_run)."""
        return (f"CASE WHEN {run}.created_at >= '{self.since.isoformat()}'::timestamptz THEN {run}.created_at "
                f"ELSE '{EPOCH.isoformat()}'::timestamptz END")

    def key(self, created_at: dt.datetime) -> dt.datetime:
        return created_at if created_at >= self.since else EPOCH


_layouts: dict[str, Layout | None] = {}


def layout(db: str | None = None, *, refresh: bool = False) -> Layout | None:
    """How the journal on `db` (the durable database) is partitioned, or None: a plain table, or
    not PostgreSQL. Read once per process (restart the workers after converting)."""
    db = db or conf.get("DATABASE")
    if refresh or db not in _layouts:
        found = tables.read_layout(db, TABLE)
        _layouts[db] = None if found is None else Layout(*found)
    return _layouts[db]


def entry_fields(run_id, db: str) -> dict:
    """The partition key of run `run_id`'s entries as a Step field, for a journal entry made with
    the ORM (nothing where the journal is a plain table)."""
    shape = layout(db)
    if shape is None:
        return {}
    from ..models import WorkflowRun

    created_at = WorkflowRun.objects.using(db).filter(pk=run_id).values_list("created_at", flat=True).first()
    return {"run_created_at": EPOCH if created_at is None else shape.key(created_at)}


# -- the conversion -------------------------------------------------------------------------------


def convert(db: str, interval: str = "month", ahead: int = 3, *, since: dt.datetime | None = None) -> Layout:
    """Partition the plain journal on `db` (see PartitionJournal); return its layout.

    Outside a transaction (a migration with ``atomic = False``), the index the partitions need is
    built CONCURRENTLY first, so writes go on while it is made; inside one, it is built plainly
    (right for a small table). The swap itself is one short transaction. `since`, an earlier
    moment the time partitions begin at, is for an empty journal only (a benchmark's history).
    """
    tables.check_interval(interval)
    tables.check_ahead(ahead)
    connection = connections[db]
    if connection.vendor != "postgresql":
        raise NotImplementedError("Only a journal on PostgreSQL can be partitioned.")
    current = layout(db, refresh=True)
    if current is not None:
        return current
    concurrently = "CONCURRENTLY " if not connection.in_atomic_block else ""
    with connection.cursor() as cursor:
        # The unique index every partition needs (the partition key is part of it), built on the
        # table as it is; the partitioned parent's own index then adopts it instead of building one.
        cursor.execute(f"CREATE UNIQUE INDEX {concurrently}IF NOT EXISTS durable_step_run_key_created "
                       f"ON {TABLE} (run_id, key, run_created_at)")
        tables.check_before(db, cursor, TABLE, "run_created_at")
        with transaction.atomic(using=db):
            # The journal locked first, so that no entry comes while the time partitions begin at
            # is taken: past every run's creation, as the 1970 key all the entries there have says.
            cursor.execute(f"LOCK TABLE {TABLE} IN ACCESS EXCLUSIVE MODE")
            cursor.execute("SELECT max(created_at) FROM durable_workflow_run")
            since = tables.conversion_time(cursor, TABLE, since, latest=cursor.fetchone()[0])
            before = f"{TABLE}_before_{since:%Y%m%d}"
            cursor.execute(f"SELECT coalesce(max(id), 0) + 1 FROM {TABLE}")
            next_id = cursor.fetchone()[0]
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
            cursor.execute(f"CREATE INDEX durable_step_open_waiting ON {TABLE} (run_id) "
                           "WHERE status = 'waiting' AND kind IN ('signal', 'event', 'approval')")
            # A worker started before the conversion writes 1970 as every entry's key, which puts
            # it here: refused for a run created since, so that no run has entries under two keys.
            # The run is found by its primary key whatever the statistics say (enable_seqscan off
            # for the function alone): planned while the runs looked few, the lookup was a scan of
            # every run for every entry written here (measured: 8,000 entries 13.5 s, quadratic).
            cursor.execute(f"""
                CREATE OR REPLACE FUNCTION durable_step_refuse_stale_writer() RETURNS trigger
                SET enable_seqscan = off AS $$
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
            tables.describe(cursor, TABLE, since, interval)
            tables.first_partition(cursor, TABLE, since, interval)
        _layouts[db] = shape
    ensure_ahead(db, ahead)
    tables.analyze(db, TABLE)
    return shape


class PartitionJournal(tables.PartitionOperation):
    """Partition the journal by time on PostgreSQL; nothing elsewhere. In a project's migration:

        class Migration(migrations.Migration):
            atomic = False  # the index is then built without blocking writes
            dependencies = [("django_durable", "0019_journal_partition_key")]
            operations = [PartitionJournal(interval="month", ahead=3)]

    Not reversible: going back would copy the whole journal. Stop the workers (or restart them
    right after): one started before the conversion is refused its writes of runs created since.
    """

    what = "journal"
    convert = staticmethod(convert)


# -- upkeep ---------------------------------------------------------------------------------------


def partitions(db: str | None = None) -> list[Partition]:
    """The journal's partitions, oldest first (none for a plain table)."""
    db = db or conf.get("DATABASE")
    return tables.partitions(db, TABLE) if layout(db) is not None else []


def ensure_ahead(db: str | None = None, ahead: int = 3) -> list[str]:
    """Make the partitions of the current interval and the `ahead` next; return the names of those made."""
    db = db or conf.get("DATABASE")
    shape = layout(db)
    return [] if shape is None else tables.ensure_ahead(db, TABLE, shape, ahead)


def droppable(db: str | None = None, margin: dt.timedelta = dt.timedelta(hours=1),
              now: dt.datetime | None = None) -> list[Partition]:
    """The partitions past (ended `margin` before now, the database's clock unless given) none of
    whose runs is left."""
    from ..models import WorkflowRun

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
    tables.drop(db or conf.get("DATABASE"), TABLE, partition)


def delete_runs(runs, db: str) -> tuple[int, dict]:
    """Delete `runs` (a queryset) as QuerySet.delete() does; where the journal is partitioned, except
    their entries in time partitions, which the DROP of their partition takes (those from before
    the conversion go with their run: the old table keeps its foreign key)."""
    from django.db.models.deletion import Collector

    from ..models import Step

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
