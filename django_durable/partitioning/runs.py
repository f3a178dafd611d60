"""The runs table in time partitions (PostgreSQL, optional): a month of finished runs leaves by one DROP.

Partitioned by ``WorkflowRun.id_time``, the time each run's id carries (ids.py): one id always
falls in one partition, so the primary key (id, id_time) keeps ids unique across all of them, and
every statement of the hot path names the partition of the run it touches
(``id_time = durable_run_id_time(id)``, which PostgreSQL evaluates before it runs): a claim, a
checkpoint and a finish read one partition however many there are. A child's id carries its
parent's time, so a family of runs shares a partition.

- ``PartitionRuns``, a migration operation after ``PartitionJournal``, turns the plain table into
  the partitioned one without rewriting it: the table as it is becomes the partition of everything
  before the conversion (its rows keep id_time = 1970), and partitions for the coming intervals
  are made.
- Two rules must hold across all time, not within one partition: a workflow's idempotency key
  (durable_run_idempotency) and one unfinished run per subject for a ``one_at_a_time`` workflow
  (durable_run_subject_lock). Triggers keep those side tables with the runs, so only the starts
  that use them pay their write; the engine's statements stay as they are.
- Foreign keys to a run are dropped (a partitioned table's keys hold its partition key); Django's
  deletions still cascade, and the prune deletes a dropped partition's rows in other tables.
- ``expired``/``drop`` let the prune drop a past partition once every run in it is finished and
  past its retention, after deleting what hangs off those runs in batches (retention.py).
"""

from __future__ import annotations

import datetime as dt
import uuid

from django.db import connections, transaction

from .. import conf, ids
from ..ids import EPOCH
from . import journal, tables
from .keys import TABLE, Layout, _layouts, key, layout, lookup  # noqa: F401 - this module's API too
from .tables import Partition

IDEMPOTENCY = "durable_run_idempotency"
SUBJECT_LOCKS = "durable_run_subject_lock"
_TERMINAL = "('cancelled', 'compensation_failed', 'completed', 'failed', 'timed_out')"


# -- the conversion -------------------------------------------------------------------------------


def convert(db: str, interval: str = "month", ahead: int = 3, *, since: dt.datetime | None = None) -> Layout:
    """Partition the plain runs table on `db` (see PartitionRuns); return its layout.

    Outside a transaction (a migration with ``atomic = False``) the indexes the partitions need
    are built CONCURRENTLY first, so writes go on while they are made; inside one, plainly (right
    for a small table). Then one transaction fills the side tables and swaps the tables, holding
    the runs table locked meanwhile. `since`, an earlier moment the time partitions begin at, is
    for an empty table only (a benchmark's history).
    """
    tables.check_interval(interval)
    tables.check_ahead(ahead)
    connection = connections[db]
    if connection.vendor != "postgresql":
        raise NotImplementedError("Only a runs table on PostgreSQL can be partitioned.")
    current = layout(db, refresh=True)
    if current is not None:
        return current
    if journal.layout(db, refresh=True) is None:
        raise ValueError("Partition the journal first (PartitionJournal in an earlier migration): dropping a "
                         "month of runs would otherwise leave their journal entries to delete one by one.")
    concurrently = "CONCURRENTLY " if not connection.in_atomic_block else ""
    with connection.cursor() as cursor:
        # The primary key every partition needs (the partition key is part of it), and the
        # idempotency key's index, no longer unique (its rule moves to a side table), built on
        # the table as it is; the partitioned parent's indexes then adopt them.
        cursor.execute(f"CREATE UNIQUE INDEX {concurrently}IF NOT EXISTS durable_run_id_time_key "
                       f"ON {TABLE} (id, id_time)")
        cursor.execute(f"CREATE INDEX {concurrently}IF NOT EXISTS durable_run_idempotency_lookup "
                       f"ON {TABLE} (workflow, idempotency_key) WHERE idempotency_key IS NOT NULL")
        tables.check_before(db, cursor, TABLE, "id_time")
        with transaction.atomic(using=db):
            # The table locked first, so that no run comes while the time partitions begin at is
            # taken: past the time every id there carries (a process's clock may run ahead of the
            # database's), as the 1970 key all the runs there have says.
            cursor.execute(f"LOCK TABLE {TABLE} IN ACCESS EXCLUSIVE MODE")
            since = tables.conversion_time(cursor, TABLE, since, latest=_latest_id_time(cursor))
            before = f"{TABLE}_before_{since:%Y%m%d}"
            _drop_references(cursor)
            # The rules that hold across all time leave the table for their side tables.
            cursor.execute("DROP INDEX IF EXISTS durable_run_idempotency_key")
            cursor.execute("DROP INDEX IF EXISTS durable_run_one_at_a_time")
            _side_tables(cursor)
            cursor.execute(f"ALTER TABLE {TABLE} DROP CONSTRAINT {TABLE}_pkey")
            cursor.execute(f"ALTER TABLE {TABLE} ADD CONSTRAINT {before}_pkey PRIMARY KEY USING INDEX "
                           "durable_run_id_time_key")
            # Each index again on the parent, under its own name, adopting the old table's (renamed).
            cursor.execute("SELECT i.relname, pg_get_indexdef(i.oid) FROM pg_index AS x "
                           "JOIN pg_class AS i ON i.oid = x.indexrelid "
                           "WHERE x.indrelid = %s::regclass AND NOT x.indisprimary", [TABLE])
            indexes = cursor.fetchall()
            for name, _ in indexes:
                cursor.execute(f'ALTER INDEX "{name}" RENAME TO "{name[:50]}_before"')
            cursor.execute(f"ALTER TABLE {TABLE} RENAME TO {before}")
            cursor.execute(f"CREATE TABLE {TABLE} (LIKE {before} INCLUDING DEFAULTS) PARTITION BY RANGE (id_time)")
            cursor.execute(f"ALTER TABLE {TABLE} ADD CONSTRAINT {TABLE}_pkey PRIMARY KEY (id, id_time)")
            cursor.execute(f"ALTER TABLE {TABLE} ATTACH PARTITION {before} FOR VALUES FROM (MINVALUE) TO (%s)",
                           [since])
            for _, definition in indexes:
                cursor.execute(definition)
            since_ms = int((since - EPOCH) / dt.timedelta(milliseconds=1))
            cursor.execute(ids.ID_TIME_FUNCTION.format(since_ms=since_ms))
            _triggers(cursor, before, since)
            tables.describe(cursor, TABLE, since, interval)
            tables.first_partition(cursor, TABLE, since, interval)
        shape = _layouts[db] = Layout(since=since, interval=interval)
    ensure_ahead(db, ahead)
    tables.analyze(db, TABLE)
    return shape


def _latest_id_time(cursor) -> dt.datetime | None:
    """The latest time an id in the runs table carries (ids with a time only: versions 7 and 8)."""
    cursor.execute(f"SELECT id FROM {TABLE} WHERE substr(id::text, 15, 1) IN ('7', '8') ORDER BY id DESC LIMIT 1")
    row = cursor.fetchone()
    return None if row is None else ids.id_time(row[0], EPOCH)


def _drop_references(cursor) -> None:
    """Drop every foreign key to a run: a key of a partitioned table must hold its partition key.
    Django still cascades its own deletions; the prune deletes what hangs off a dropped partition."""
    cursor.execute("SELECT conrelid::regclass::text, conname FROM pg_constraint "
                   "WHERE confrelid = %s::regclass AND contype = 'f'", [TABLE])
    for table, name in cursor.fetchall():
        cursor.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')


def _side_tables(cursor) -> None:
    """The idempotency keys of all time and the subject locks of unfinished runs, from the runs."""
    cursor.execute(f"""
        CREATE TABLE {IDEMPOTENCY} (
            workflow varchar(200) NOT NULL, idempotency_key varchar(255) NOT NULL, run_id uuid NOT NULL,
            CONSTRAINT durable_run_idempotency_key PRIMARY KEY (workflow, idempotency_key))""")
    cursor.execute(f"CREATE INDEX {IDEMPOTENCY}_run ON {IDEMPOTENCY} (run_id)")
    cursor.execute(f"""
        CREATE TABLE {SUBJECT_LOCKS} (
            workflow varchar(200) NOT NULL, subject_lock varchar(300) NOT NULL, run_id uuid NOT NULL,
            CONSTRAINT durable_run_one_at_a_time PRIMARY KEY (workflow, subject_lock))""")
    cursor.execute(f"CREATE INDEX {SUBJECT_LOCKS}_run ON {SUBJECT_LOCKS} (run_id)")
    cursor.execute(f"INSERT INTO {IDEMPOTENCY} SELECT workflow, idempotency_key, id FROM {TABLE} "
                   "WHERE idempotency_key IS NOT NULL")
    cursor.execute(f"INSERT INTO {SUBJECT_LOCKS} SELECT workflow, subject_lock, id FROM {TABLE} "
                   f"WHERE subject_lock IS NOT NULL AND status NOT IN {_TERMINAL}")


def _triggers(cursor, before: str, since: dt.datetime) -> None:
    # A run's idempotency key and subject lock, taken as it is inserted: an idempotency key taken
    # already inserts nothing (as ON CONFLICT DO NOTHING on the plain table's unique index did);
    # a subject locked by another unfinished run is a unique violation (as its partial index was).
    # A retried insert of the same run (a child's, derived from its parent) finds its own lock.
    cursor.execute(f"""
        CREATE OR REPLACE FUNCTION durable_run_keys_insert() RETURNS trigger AS $$
        BEGIN
            IF NEW.idempotency_key IS NOT NULL THEN
                INSERT INTO {IDEMPOTENCY} VALUES (NEW.workflow, NEW.idempotency_key, NEW.id) ON CONFLICT DO NOTHING;
                IF NOT FOUND THEN
                    RETURN NULL;
                END IF;
            END IF;
            IF NEW.subject_lock IS NOT NULL AND NEW.status NOT IN {_TERMINAL} THEN
                INSERT INTO {SUBJECT_LOCKS} VALUES (NEW.workflow, NEW.subject_lock, NEW.id) ON CONFLICT DO NOTHING;
                IF NOT FOUND AND NOT EXISTS (SELECT 1 FROM {SUBJECT_LOCKS} WHERE workflow = NEW.workflow
                                             AND subject_lock = NEW.subject_lock AND run_id = NEW.id) THEN
                    RAISE unique_violation USING CONSTRAINT = 'durable_run_one_at_a_time',
                        MESSAGE = format('%s already has an unfinished run of %s.', NEW.subject_lock, NEW.workflow);
                END IF;
            END IF;
            RETURN NEW;
        END $$ LANGUAGE plpgsql""")
    cursor.execute(f"CREATE TRIGGER durable_run_keys_insert BEFORE INSERT ON {TABLE} FOR EACH ROW "
                   "WHEN (NEW.idempotency_key IS NOT NULL OR NEW.subject_lock IS NOT NULL) "
                   "EXECUTE FUNCTION durable_run_keys_insert()")
    # The lock goes when the run ends and comes back if an operator retries it.
    cursor.execute(f"""
        CREATE OR REPLACE FUNCTION durable_run_subject_lock_status() RETURNS trigger AS $$
        BEGIN
            IF NEW.status IN {_TERMINAL} THEN
                DELETE FROM {SUBJECT_LOCKS} WHERE run_id = NEW.id;
            ELSIF OLD.status IN {_TERMINAL} THEN
                INSERT INTO {SUBJECT_LOCKS} VALUES (NEW.workflow, NEW.subject_lock, NEW.id);
            END IF;
            RETURN NULL;
        END $$ LANGUAGE plpgsql""")
    cursor.execute(f"CREATE TRIGGER durable_run_subject_lock_status AFTER UPDATE OF status ON {TABLE} FOR EACH ROW "
                   "WHEN (NEW.subject_lock IS NOT NULL AND OLD.status IS DISTINCT FROM NEW.status) "
                   "EXECUTE FUNCTION durable_run_subject_lock_status()")
    cursor.execute(f"""
        CREATE OR REPLACE FUNCTION durable_run_keys_delete() RETURNS trigger AS $$
        BEGIN
            DELETE FROM {IDEMPOTENCY} WHERE workflow = OLD.workflow AND idempotency_key = OLD.idempotency_key
                                          AND run_id = OLD.id;
            DELETE FROM {SUBJECT_LOCKS} WHERE run_id = OLD.id;
            RETURN NULL;
        END $$ LANGUAGE plpgsql""")
    cursor.execute(f"CREATE TRIGGER durable_run_keys_delete AFTER DELETE ON {TABLE} FOR EACH ROW "
                   "WHEN (OLD.idempotency_key IS NOT NULL OR OLD.subject_lock IS NOT NULL) "
                   "EXECUTE FUNCTION durable_run_keys_delete()")
    # A process started before the conversion writes 1970 as every new run's id_time, which puts
    # it here: refused when its id says otherwise, so that no run is where lookups do not look.
    cursor.execute(f"""
        CREATE OR REPLACE FUNCTION durable_run_refuse_stale_writer() RETURNS trigger AS $$
        BEGIN
            IF durable_run_id_time(NEW.id) <> NEW.id_time THEN
                RAISE EXCEPTION 'The runs table (durable_workflow_run) is partitioned since %: restart this '
                    'process (a durable worker started before that writes runs without their partition key).',
                    '{since.isoformat()}';
            END IF;
            RETURN NEW;
        END $$ LANGUAGE plpgsql""")
    cursor.execute(f"CREATE TRIGGER refuse_stale_writer BEFORE INSERT ON {before} "
                   "FOR EACH ROW EXECUTE FUNCTION durable_run_refuse_stale_writer()")


class PartitionRuns(tables.PartitionOperation):
    """Partition the runs table by time on PostgreSQL; nothing elsewhere. In a project's migration,
    after the one that partitions the journal:

        class Migration(migrations.Migration):
            atomic = False  # the indexes are then built without blocking writes
            dependencies = [("myapp", "0001_partition_journal"), ("django_durable", "0020_run_id_time")]
            operations = [PartitionRuns(interval="month", ahead=3)]

    Not reversible. Stop the workers (or restart them right after): one started before the
    conversion is refused its writes of new runs.
    """

    what = "runs"
    convert = staticmethod(convert)


# -- upkeep ---------------------------------------------------------------------------------------


def partitions(db: str | None = None) -> list[Partition]:
    """The runs table's partitions, oldest first (none for a plain table)."""
    db = db or conf.get("DATABASE")
    return tables.partitions(db, TABLE) if layout(db) is not None else []


def ensure_ahead(db: str | None = None, ahead: int = 3) -> list[str]:
    """Make the partitions of the current interval and the `ahead` next; return the names of those made."""
    db = db or conf.get("DATABASE")
    shape = layout(db)
    return [] if shape is None else tables.ensure_ahead(db, TABLE, shape, ahead)


def expired(partition: Partition, kept_sql: str, params: list, db: str | None = None) -> bool:
    """Whether every run in `partition` is finished and past its retention: `kept_sql` is a
    condition on a run (alias r) that holds while it must be kept (retention.kept_sql)."""
    db = db or conf.get("DATABASE")
    with connections[db].cursor() as cursor:
        cursor.execute(f"SELECT NOT EXISTS (SELECT 1 FROM {partition.name} AS r "
                       f"WHERE r.status NOT IN {_TERMINAL} OR r.finished_at IS NULL OR {kept_sql})", params)
        return cursor.fetchone()[0]


# What hangs off a run, by table: deleted before its partition is dropped (Django's cascade
# would have; the foreign keys are gone). The journal's time partitions are dropped by their own
# upkeep; its entries from before it was partitioned (1970) are deleted here.
DEPENDENTS = (
    ("durable_approval_decision", "approval_id IN (SELECT id FROM durable_approval WHERE run_id = ANY(%s))"),
    ("durable_approval", "run_id = ANY(%s)"),
    ("durable_signal", "run_id = ANY(%s)"),
    ("durable_timer", "run_id = ANY(%s)"),
    ("durable_work_item", "run_id = ANY(%s)"),
    ("durable_workflow_event", "run_id = ANY(%s)"),
    (IDEMPOTENCY, "run_id = ANY(%s)"),
    (SUBJECT_LOCKS, "run_id = ANY(%s)"),
    ("durable_step", f"run_id = ANY(%s) AND run_created_at = '{EPOCH.isoformat()}'"),
)


def run_ids(partition: Partition, after: uuid.UUID | None, batch: int, db: str | None = None) -> list[uuid.UUID]:
    """The next `batch` ids of the runs in `partition`, in order, after `after`."""
    with connections[db or conf.get("DATABASE")].cursor() as cursor:
        cursor.execute(f"SELECT id FROM {partition.name} WHERE %s::uuid IS NULL OR id > %s ORDER BY id LIMIT %s",
                       [after, after, batch])
        return [row[0] for row in cursor.fetchall()]


def delete_dependents(batch: list[uuid.UUID], db: str | None = None) -> list[str]:
    """Delete what hangs off the runs `batch` in other tables, in one short transaction; a
    schedule whose last run it was forgets it. Return the names of their payloads stored apart,
    whose files the caller deletes once this has committed."""
    db = db or conf.get("DATABASE")
    with transaction.atomic(using=db), connections[db].cursor() as cursor:
        for table, condition in DEPENDENTS:
            cursor.execute(f"DELETE FROM {table} WHERE {condition}", [batch])
        # One array, not a parameter per run: a query of 5,000 parameters costs more to send.
        cursor.execute("DELETE FROM durable_stored_payload WHERE run_id = ANY(%s) RETURNING name", [batch])
        stored = [name for (name,) in cursor.fetchall()]
        cursor.execute("UPDATE durable_schedule SET last_run_id = NULL WHERE last_run_id = ANY(%s)", [batch])
        cursor.execute(f"UPDATE {TABLE} SET parent_id = NULL WHERE parent_id = ANY(%s) AND NOT id = ANY(%s)",
                       [batch, batch])
    return stored


def drop(partition: Partition, db: str | None = None) -> None:
    """Detach `partition` without blocking the runs table (CONCURRENTLY), then drop it."""
    tables.drop(db or conf.get("DATABASE"), TABLE, partition)
