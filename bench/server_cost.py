"""What a job costs PostgreSQL, counted rather than timed: the row versions, index entries and WAL
one task (or one one-step workflow) writes, at its start and through a worker's drain.

    DATABASE_URL=postgres://... .venv/bin/python bench/server_cost.py [--jobs 2000] [--workflows]
        [--processes 2] [--json FILE]

The counts come from the WAL itself (pg_walinspect, PostgreSQL 15's contrib): between two LSNs,
every record by kind — a heap insert, a HOT or a plain update, a delete, a B-tree leaf insert (one
index entry). They do not depend on the machine's speed, so a change to the hot path shows as a
change of these numbers whatever else the machine is doing. Only one system runs between the
two LSNs (the server is the benchmark's own), so nothing else is counted; autovacuum's records
are left out by kind (Heap2 PRUNE/VACUUM, and a vacuum's B-tree records).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import run as harness  # noqa: E402  (sets Django up on bench.settings)
from django.db import connection, connections  # noqa: E402

# The records counted, by (resource manager, record type prefix): what a job writes.
KINDS = {
    "row inserts": ("Heap", "INSERT"),
    "plain updates": ("Heap", "UPDATE"),
    "HOT updates": ("Heap", "HOT_UPDATE"),
    "row deletes": ("Heap", "DELETE"),
    "row locks": ("Heap", "LOCK"),
    "index entries": ("Btree", "INSERT_LEAF"),
    "index page splits": ("Btree", "SPLIT"),
    "commits": ("Transaction", "COMMIT"),
}


def lsn() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_wal_insert_lsn()")
        return cursor.fetchone()[0]


def wal_between(start: str, end: str) -> dict:
    """Counts and bytes of the WAL records between two LSNs, by record type."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT \"resource_manager/record_type\", count, record_size + fpi_size "
                       "FROM pg_get_wal_stats(%s, %s, true) WHERE count > 0", [start, end])
        rows = cursor.fetchall()
    counted = {name: 0 for name in KINDS}
    total_bytes = 0
    for kind, count, size in rows:
        manager, _, record = kind.partition("/")
        total_bytes += size
        for name, (want_manager, want_record) in KINDS.items():
            # A row on a fresh page is "INSERT+INIT": counted as an insert; a split is SPLIT_L or SPLIT_R.
            if manager == want_manager and (record.split("+")[0] == want_record
                                            or want_record == "SPLIT" and record.startswith("SPLIT")):
                counted[name] += count
    counted["WAL bytes"] = total_bytes
    return counted


def by_relation(start: str, end: str) -> list[tuple[str, str, int]]:
    """(record type, relation, count) of the records between two LSNs that name one relation."""
    with connection.cursor() as cursor:
        cursor.execute(r"""
            SELECT resource_manager || '/' || record_type,
                   coalesce(pg_filenode_relation(0, (regexp_match(block_ref, 'rel \d+/\d+/(\d+)'))[1]::oid)::text, '?'),
                   count(*)
            FROM pg_get_wal_records_info(%s, %s)
            WHERE resource_manager IN ('Heap', 'Btree')
            GROUP BY 1, 2 ORDER BY 2, 1""", [start, end])
        return cursor.fetchall()


def per_job(counts: dict, jobs: int) -> dict:
    return {name: round(value / jobs, 2) for name, value in counts.items()}


def measure(jobs: int, processes: int, workflows: bool) -> dict:
    harness.truncate()
    with connection.cursor() as cursor:
        cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        # Keep the WAL of both phases (a checkpoint would recycle it before it is read); the
        # server's own setting comes back at the end.
        cursor.execute("ALTER SYSTEM SET wal_keep_size = '4GB'")
        cursor.execute("SELECT pg_reload_conf()")
    try:
        return _measure(jobs, processes, workflows)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER SYSTEM RESET wal_keep_size")
            cursor.execute("SELECT pg_reload_conf()")


def _measure(jobs: int, processes: int, workflows: bool) -> dict:
    import django_durable as durable
    from bench.benchapp.tasks import one_step

    with connection.cursor() as cursor:
        cursor.execute("CHECKPOINT")  # every system's first change of a page after it costs the same
    before_start = lsn()
    for n in range(jobs):
        durable.start("bench.one_step") if workflows else one_step.enqueue(n)
    after_start = lsn()
    start = per_job(wal_between(before_start, after_start), jobs), by_relation(before_start, after_start)
    connections.close_all()
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
        cursor.execute("CHECKPOINT")
    before_drain = lsn()
    _drain(processes)
    after_drain = lsn()
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM durable_workflow_run WHERE status = 'completed'")
        (done,) = cursor.fetchone()
    assert done == jobs, f"{done} of {jobs} runs completed"
    return {"jobs": jobs, "kind": "one-step workflows" if workflows else "tasks",
            "start": start[0], "drain": per_job(wal_between(before_drain, after_drain), jobs),
            "by_relation": {"start": start[1], "drain": by_relation(before_drain, after_drain)}}


def _drain(processes: int) -> None:
    import subprocess

    subprocess.run(harness.worker_command("--burst", "-c", str(processes), "-v", "0"), env=harness.worker_env(),
                   check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--workflows", action="store_true", help="one-step workflows instead of tasks")
    parser.add_argument("--by-relation", action="store_true", help="and the records a job writes, by table and index")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result = measure(args.jobs, args.processes, args.workflows)
    print(f"What one of {args.jobs} {result['kind']} writes (WAL records a job):")
    print(f"  {'':22} {'start':>9} {'drain':>9}")
    for name in (*KINDS, "WAL bytes"):
        print(f"  {name:22} {result['start'][name]:9} {result['drain'][name]:9}")
    if args.by_relation:
        for phase in ("start", "drain"):
            print(f"{phase}, by table and index (records a job):")
            for kind, relation, count in result["by_relation"][phase]:
                print(f"  {kind:22} {relation:40} {count / args.jobs:6.2f}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
