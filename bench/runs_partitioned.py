"""An experiment, not a feature: the runs table itself in time partitions, to measure what it costs.

django_durable partitions the journal (partitioning.py) but not the runs table. This module lays
out an *empty* runs table the way partitioning it would have to be done, so that bench/history.py
(--partitioned-runs) can measure the claim path, start-to-result and the admin on it against the
journal-only layout, with the same history:

- The runs table is partitioned by RANGE (created_at), monthly; its primary key becomes
  (id, created_at), as PostgreSQL requires the partition key in every unique index.
- What must stay unique across all time moves to a narrow side table, durable_run_key (id, created_at,
  workflow, idempotency_key, subject_lock), kept by triggers: a run's id, a workflow's idempotency
  key, and one unfinished run per subject (the lock is cleared when the run ends). An insert whose
  id or key exists already inserts nothing, as the engine's ON CONFLICT DO NOTHING expects.
- Every foreign key that referenced a run references its durable_run_key row instead (a foreign
  key needs a unique target; a partitioned table by time has none on the id alone).
- Lookups by id alone (the whole claim path) cannot name a partition: each probes every
  partition's index. That is the cost measured here.

Not done, and what a real PartitionRuns would still need: converting a table that has rows (the
side table filled, the FKs re-pointed NOT VALID then validated), a `before` partition, the engine's
one-at-a-time error under ON CONFLICT, and a prune that drops a month whose runs are all past
their retention instead of deleting them (see docs/scaling.md).
"""

from __future__ import annotations

import datetime as dt

from django.db import connection

from django_durable.models import WorkflowRun
from django_durable.partitioning import _floor, _next

TABLE = "durable_workflow_run"
KEYS = "durable_run_key"
TERMINAL = ", ".join(f"'{status}'" for status in sorted(WorkflowRun.TERMINAL))
INDEXES = [
    "durable_run_status_list ON {t} (status, created_at DESC, id DESC)",
    "durable_run_workflow_list ON {t} (workflow, created_at DESC, id DESC)",
    "durable_run_created_list ON {t} (created_at DESC, id DESC)",
    "durable_run_finished ON {t} (finished_at) WHERE finished_at IS NOT NULL",
    "durable_run_subject ON {t} (subject_type_id, subject_id, created_at DESC) WHERE subject_id IS NOT NULL",
    "durable_run_parent ON {t} (parent_id)",
    "durable_run_subject_type ON {t} (subject_type_id)",
]


def partition_name(start: dt.datetime) -> str:
    return f"{TABLE}_p{start:%Y%m%d}"


def convert(since: dt.datetime, ahead: int = 3) -> list[str]:
    """Lay the empty runs table out in monthly partitions from `since` to `ahead` months past now."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {TABLE})")
        if cursor.fetchone()[0]:
            raise ValueError("The experiment lays out an empty runs table only.")
        cursor.execute(f"""
            CREATE TABLE {KEYS} (
                id uuid PRIMARY KEY, created_at timestamptz NOT NULL, workflow varchar(200) NOT NULL,
                idempotency_key varchar(255), subject_lock varchar(300))""")
        cursor.execute(f"CREATE UNIQUE INDEX durable_run_key_idempotency ON {KEYS} (workflow, idempotency_key) "
                       "WHERE idempotency_key IS NOT NULL")
        cursor.execute(f"CREATE UNIQUE INDEX durable_run_key_one_at_a_time ON {KEYS} (workflow, subject_lock) "
                       "WHERE subject_lock IS NOT NULL")
        cursor.execute("SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint "
                       "WHERE confrelid = %s::regclass AND contype = 'f'", [TABLE])
        references = cursor.fetchall()
        for table, name, _ in references:
            cursor.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')
        cursor.execute(f"ALTER TABLE {TABLE} RENAME TO {TABLE}_plain")
        cursor.execute(f"CREATE TABLE {TABLE} (LIKE {TABLE}_plain INCLUDING DEFAULTS INCLUDING CONSTRAINTS) "
                       "PARTITION BY RANGE (created_at)")
        cursor.execute(f"DROP TABLE {TABLE}_plain")
        cursor.execute(f"ALTER TABLE {TABLE} ADD PRIMARY KEY (id, created_at)")
        for index in INDEXES:
            cursor.execute("CREATE INDEX " + index.format(t=TABLE))
        for table, name, definition in references:
            definition = definition.replace(f"REFERENCES {TABLE}(id)", f"REFERENCES {KEYS}(id)")
            cursor.execute(f'ALTER TABLE {table} ADD CONSTRAINT "{name}" {definition}')
        cursor.execute(f"""
            CREATE FUNCTION durable_run_key_insert() RETURNS trigger AS $$
            BEGIN
                INSERT INTO {KEYS} (id, created_at, workflow, idempotency_key)
                VALUES (NEW.id, NEW.created_at, NEW.workflow, NEW.idempotency_key) ON CONFLICT DO NOTHING;
                IF NOT FOUND THEN
                    RETURN NULL;  -- the id or the idempotency key exists: nothing inserted
                END IF;
                IF NEW.subject_lock IS NOT NULL AND NEW.status NOT IN ({TERMINAL}) THEN
                    UPDATE {KEYS} SET subject_lock = NEW.subject_lock WHERE id = NEW.id;
                END IF;
                RETURN NEW;
            END $$ LANGUAGE plpgsql""")
        cursor.execute(f"""
            CREATE FUNCTION durable_run_key_status() RETURNS trigger AS $$
            BEGIN
                UPDATE {KEYS} SET subject_lock = CASE WHEN NEW.status IN ({TERMINAL}) THEN NULL
                                                      ELSE NEW.subject_lock END
                WHERE id = NEW.id;
                RETURN NULL;
            END $$ LANGUAGE plpgsql""")
        cursor.execute(f"""
            CREATE FUNCTION durable_run_key_delete() RETURNS trigger AS $$
            BEGIN
                DELETE FROM {KEYS} WHERE id = OLD.id;
                RETURN NULL;
            END $$ LANGUAGE plpgsql""")
        cursor.execute(f"CREATE TRIGGER durable_run_key_insert BEFORE INSERT ON {TABLE} "
                       "FOR EACH ROW EXECUTE FUNCTION durable_run_key_insert()")
        cursor.execute(f"CREATE TRIGGER durable_run_key_status AFTER UPDATE OF status ON {TABLE} FOR EACH ROW "
                       "WHEN (NEW.subject_lock IS NOT NULL AND OLD.status IS DISTINCT FROM NEW.status) "
                       "EXECUTE FUNCTION durable_run_key_status()")
        cursor.execute(f"CREATE TRIGGER durable_run_key_delete AFTER DELETE ON {TABLE} "
                       "FOR EACH ROW EXECUTE FUNCTION durable_run_key_delete()")
        cursor.execute("SELECT statement_timestamp()")
        horizon = cursor.fetchone()[0].astimezone(dt.timezone.utc)
    for _ in range(ahead + 1):
        horizon = _next(_floor(horizon, "month"), "month")
    made, start = [], since
    with connection.cursor() as cursor:
        while start < horizon:
            end = _next(_floor(start, "month"), "month")
            cursor.execute(f"CREATE TABLE {partition_name(start)} PARTITION OF {TABLE} FOR VALUES FROM (%s) TO (%s)",
                           [start, end])
            made.append(partition_name(start))
            start = end
    return made


def fill_keys() -> None:
    """The side table's rows for runs copied in without triggers (COPY as the replica role)."""
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {KEYS} (id, created_at, workflow, idempotency_key, subject_lock) "
                       f"SELECT id, created_at, workflow, idempotency_key, "
                       f"CASE WHEN status NOT IN ({TERMINAL}) THEN subject_lock END FROM {TABLE} "
                       "ON CONFLICT DO NOTHING")
        cursor.execute(f"ANALYZE {KEYS}")


def drop_empty(now: dt.datetime) -> list[str]:
    """Drop the past partitions of runs that hold no run (after a prune): DETACH CONCURRENTLY, DROP."""
    dropped = []
    with connection.cursor() as cursor:
        cursor.execute("SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits AS i "
                       "JOIN pg_class AS c ON c.oid = i.inhrelid WHERE i.inhparent = %s::regclass", [TABLE])
        for name, bound in cursor.fetchall():
            end = dt.datetime.fromisoformat(bound.rsplit("TO ('", 1)[1].split("'")[0])
            if end > now:
                continue
            cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {name})")
            if not cursor.fetchone()[0]:
                cursor.execute(f"ALTER TABLE {TABLE} DETACH PARTITION {name} CONCURRENTLY")
                cursor.execute(f"DROP TABLE {name}")
                dropped.append(name)
        cursor.execute(f"ANALYZE {TABLE}")
    return dropped
