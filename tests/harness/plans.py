"""The generic plans of the hot path's statements, on a database of its own in a given state.

    python -m tests.harness.plans SERVER_URL STATE [GOLDEN]    prints a JSON report, exit 0

SERVER_URL is a PostgreSQL server (any database on it); a database named for STATE is made there
afresh and migrated. STATE is one of:

- ``never-analyzed``: the tables as a fresh install has them, empty and never analyzed;
- ``bulk-loaded``: 100,000 runs, their ready items and journal entries loaded, never analyzed;
- ``analyzed-empty``: a few rows, ANALYZEd (statistics say the tables are nearly empty), and then
  the 100,000 loaded without another ANALYZE (the statistics are stale);
- ``held-snapshot``: 100,000 runs loaded and analyzed, then every ready item ended while another
  session holds its snapshot, and ANALYZEd again: the statistics say nothing is pending, while the
  indexes of pending items still hold all 100,000 entries, which no VACUUM may remove (what an
  autovacuum's ANALYZE leaves while a long transaction holds the cleanup horizon back);
- ``partitioned``: the journal and the runs table partitioned by day (PartitionJournal,
  PartitionRuns), then the 100,000 loaded into the partition before the conversion, not analyzed
  since; its statements are those of tests/golden/postgres_statements_partitioned.sql.

Each statement of GOLDEN (the state's golden file by default) is prepared and its generic plan
explained, as a worker's prepared statement is planned once and kept. The report names, for each
statement, every node that reads the work-item, run, journal or timer tables in a way whose cost grows
with the table: a sequential scan, a sort of what such a scan read, or an index scan with no index
condition (a walk of the whole index), other than the claim's ordered walk to the first ready item
under its LIMIT and the count of claimed items a limited queue's claim makes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[2]  # the checkout
TABLES = {"durable_work_item", "durable_workflow_run", "durable_step", "durable_timer"}
# Indexes whose rows are few by design, whatever the table holds: the claimed items (at most one per
# worker slot), which a limited queue's claim counts.
SMALL = {"durable_work_item_claimed"}
# The cost PostgreSQL gives a node of a kind its settings turn off (enable_seqscan = off): what a
# batch's claim sets; a plan that still needs such a node is priced past jit_above_cost.
DISABLED = 1e9
STATES = ("never-analyzed", "bulk-loaded", "analyzed-empty", "held-snapshot", "partitioned")
GOLDEN = ROOT / "tests" / "golden" / "postgres_statements.sql"
GOLDEN_PARTITIONED = ROOT / "tests" / "golden" / "postgres_statements_partitioned.sql"


def golden_of(state: str) -> Path:
    return GOLDEN_PARTITIONED if state == "partitioned" else GOLDEN
ROWS = 100_000


def statements(golden: Path) -> list[tuple[str, int, str]]:
    """(name, number of parameters, SQL) of each statement of the golden file."""
    found = re.findall(r"^-- name: (.*?) \((\d+) parameters\)\n(.*?);\n", golden.read_text(), re.S | re.M)
    return [(name, int(count), sql) for name, count, sql in found]


def numbered(sql: str) -> str:
    parts = sql.split("%s")
    return "".join(f"{part}${index}" for index, part in enumerate(parts[:-1], 1)) + parts[-1]


# The conversion a project's own migrations make (docs/partitioning.md), in the migrated database.
PARTITION = """
import django; django.setup()
from django.db import connection
from django_durable import partitioning
with connection.schema_editor(atomic=False) as editor:
    partitioning.PartitionJournal(interval="day").database_forwards("app", editor, None, None)
    partitioning.PartitionRuns(interval="day").database_forwards("app", editor, None, None)
"""


def fresh_database(server: str, name: str, partitioned: bool = False) -> str:
    """A new, migrated database `name` on `server` (its journal and runs partitioned, if asked);
    return its URL."""
    admin = re.sub(r"/[^/]*$", "/postgres", server)
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}"')
        connection.execute(f'CREATE DATABASE "{name}"')
    url = re.sub(r"/[^/]*$", f"/{name}", server)
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "bench.settings", "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", "import django; django.setup(); from django.core.management import "
                    "call_command; call_command('migrate', verbosity=0)"], env=env, check=True, cwd=ROOT)
    if partitioned:
        subprocess.run([sys.executable, "-c", PARTITION], env=env, check=True, cwd=ROOT)
    return url


def load(connection, rows: int) -> None:
    """`rows` more runs, each with its ready advance item, two journal entries and a pending timer
    (a signal's timeout, a day ahead): runs made a day ago (on a converted database, before the conversion: in the partition before, as the runs a
    project has when it converts)."""
    connection.execute(f"""
        WITH run AS (
            INSERT INTO durable_workflow_run (id, workflow, status, waiting_on, input, attempt, max_attempts, queue,
                                              priority, concurrency_key, detached, awaited, last_worker, id_time,
                                              created_at)
            SELECT gen_random_uuid(), 'load', 'pending', '', '{{}}', 1, 1, 'default', 0, '', false, false, '',
                   '1970-01-01', now() - interval '1 day'
            FROM generate_series(1, {rows})
            RETURNING id
        ),
        item AS (
            INSERT INTO durable_work_item (kind, run_id, step_key, "group", function, queue, priority,
                                           concurrency_key, status, available_at, attempts, wake, claimed_by, last_error)
            SELECT 'advance', id, '', '', '', 'default', 0, '', 'pending', now(), 0, false, '', '' FROM run
            RETURNING 1
        ),
        step AS (
            INSERT INTO durable_step (run_id, key, seq, kind, name, status, attempts, run_created_at)
            SELECT run.id, 's' || n, n, 'step', 'f', 'completed', 1, '1970-01-01'
            FROM run, generate_series(1, 2) AS n
            RETURNING 1
        )
        INSERT INTO durable_timer (kind, run_id, step_key, fire_at, status)
        SELECT 'signal_timeout', id, 's3', now() + interval '1 day', 'pending' FROM run""")


def offenders(plan: dict, under_limit: bool = False) -> list[str]:
    """The nodes of an EXPLAIN (FORMAT JSON) plan that read a hot table at a cost that grows with it.

    A scan under a LIMIT stops at its first rows (the claim's ordered walk to the first ready item),
    and a sort of what such scans return sorts a row or a few (the first ready item of each queue).
    """
    found = []
    kind, relation = plan.get("Node Type", ""), plan.get("Relation Name")
    if plan.get("Total Cost", 0) >= DISABLED:  # (a parent's cost includes its children's: name the node)
        if not any(child.get("Total Cost", 0) >= DISABLED for child in plan.get("Plans", [])):
            found.append(f"{kind} on {relation or 'a subquery'} priced as disabled (a statement this costly "
                         f"is compiled by the JIT at each execution)")
    if kind == "Seq Scan" and relation in TABLES:
        found.append(f"Seq Scan on {relation}")
    elif kind in ("Sort", "Incremental Sort") and _reads_unbounded(plan):
        found.append(f"{kind} ({', '.join(plan.get('Sort Key', []))})")
    elif kind in ("Index Scan", "Index Only Scan") and relation in TABLES and "Index Cond" not in plan \
            and not under_limit and plan.get("Index Name") not in SMALL:
        found.append(f"{kind} on {relation} using {plan.get('Index Name')} with no index condition")
    elif kind == "Bitmap Heap Scan" and relation in TABLES and not _bitmap_conditions(plan):
        found.append(f"Bitmap Heap Scan on {relation} with no index condition")
    for child in plan.get("Plans", []):
        found += offenders(child, under_limit or kind == "Limit")
    return found


def _bitmap_conditions(plan: dict) -> bool:
    """Whether every bitmap index scan under a bitmap heap scan has an index condition."""
    scans = [child for child in plan.get("Plans", []) if child.get("Node Type") == "Bitmap Index Scan"]
    nested = [child for child in plan.get("Plans", []) if child.get("Node Type") in ("BitmapAnd", "BitmapOr")]
    return all("Index Cond" in scan or scan.get("Index Name") in SMALL for scan in scans) \
        and all(_bitmap_conditions(child) for child in nested)


def _reads_unbounded(plan: dict) -> bool:
    """Whether a hot table is read below `plan` other than under a LIMIT."""
    for child in plan.get("Plans", []):
        if child.get("Node Type") == "Limit":
            continue
        if child.get("Relation Name") in TABLES or _reads_unbounded(child):
            return True
    return False


def main() -> None:
    server, state = sys.argv[1], sys.argv[2]
    if state not in STATES:
        raise SystemExit(f"Not a state: {state!r}; use one of {', '.join(STATES)}.")
    golden = Path(sys.argv[3]) if len(sys.argv) > 3 else golden_of(state)
    url = fresh_database(server, f"plans_{state.replace('-', '_')}", partitioned=state == "partitioned")
    # `holder` holds a snapshot in the held-snapshot state, until the plans are made.
    with psycopg.connect(url, autocommit=True) as connection, psycopg.connect(url) as holder:
        if state in ("bulk-loaded", "partitioned"):
            load(connection, ROWS)
        elif state == "analyzed-empty":
            load(connection, 3)
            connection.execute("ANALYZE")
            load(connection, ROWS)
        elif state == "held-snapshot":
            load(connection, ROWS)
            connection.execute("ANALYZE")
            holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            holder.execute("SELECT count(*) FROM durable_work_item")
            connection.execute("UPDATE durable_work_item SET status = 'completed' WHERE status = 'pending'")
            connection.execute("ANALYZE")
        report = plan_all(connection, golden)
    drop_database(server, f"plans_{state.replace('-', '_')}")
    print(json.dumps({"state": state, "statements": report}))


def plan_all(connection, golden: Path) -> dict[str, list[str]]:
    """offenders() of the generic plan of each statement of `golden`, by name."""
    report = {}
    # As a worker's prepared statement: planned once for any parameters, and kept.
    connection.execute("SET plan_cache_mode = force_generic_plan")
    settings = []  # a SET LOCAL sent before a statement in its transaction holds while it is planned
    for index, (name, count, sql) in enumerate(statements(golden)):
        if sql.startswith("SET LOCAL "):
            settings.append(sql.removeprefix("SET LOCAL ").split(" TO ")[0])
            connection.execute(sql.replace("SET LOCAL ", "SET ", 1))
            continue
        connection.execute(f"PREPARE hot{index} AS {numbered(sql)}")
        (plan,), = connection.execute(
            f"EXPLAIN (FORMAT JSON) EXECUTE hot{index}({', '.join(['NULL'] * count)})").fetchall()
        report[name] = offenders(plan[0]["Plan"])
        connection.execute(f"DEALLOCATE hot{index}")
        for setting in settings:
            connection.execute(f"RESET {setting}")
        settings.clear()
    return report


def drop_database(server: str, name: str) -> None:
    with psycopg.connect(re.sub(r"/[^/]*$", "/postgres", server), autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}"')


if __name__ == "__main__":
    main()
