"""Years of history: W1, W2 and the admin's run list and overview on an empty database and on one
holding millions of finished runs, before and after a prune (issue 16).

    DATABASE_URL=postgres://... python bench/history.py --runs 10000000 --steps 10

The history is copied in with COPY, not made through the engine: one real run of `--steps` steps
is made first, and every row it left (the run, its journal, its work item, its audit entries) is
the template of each copied run, with new ids and a finish time spread over the last `--days`.
Then, each measured on the same server in the same process:

  empty    (--base-runs finished runs, a page of them) W1 (ten-step workflows, N worker processes), W2 (start to result on an idle worker),
           the admin's run list and overview (p50 of 20 loads)
  history  the same, with the history in place (ANALYZEd)
  pruned   the same after `durable prune` deleted the oldest `--prune-share` of it, and VACUUM
The dead tuples of the durable tables are printed after the prune and after the VACUUM.

--partitioned puts the journal in monthly partitions (PartitionJournal); --partitioned-runs also the
runs table (PartitionRuns), whose expired months the prune then drops.
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")

import django  # noqa: E402

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection, connections  # noqa: E402
from django.test import Client  # noqa: E402

import django_durable as durable  # noqa: E402
from django_durable import partitioning  # noqa: E402
from django_durable.models import WorkflowRun  # noqa: E402
from bench.admin_pages import measure  # noqa: E402
from bench.run import quantile, worker_command, worker_env  # noqa: E402

TABLES = ["durable_workflow_run", "durable_step", "durable_work_item", "durable_workflow_event"]


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# -- the history ----------------------------------------------------------------------------------


def template(steps: int) -> dict[str, tuple[list[str], list[str]]]:
    """One real finished run: for each table, its columns (without serial ids) and rows as COPY text."""
    run = durable.start("bench.ten_steps", n=steps)
    connections.close_all()
    subprocess.run(worker_command("--burst", "-c", "1", "-v", "0"), env=worker_env(), check=True, cwd=ROOT)
    rows = {}
    connection.ensure_connection()
    with connection.connection.cursor() as cursor:
        for table in TABLES:
            cursor.execute("SELECT column_name FROM information_schema.columns WHERE table_name = %s "
                           "AND NOT (column_name = 'id' AND data_type = 'bigint') ORDER BY ordinal_position", [table])
            columns = [name for (name,) in cursor.fetchall()]
            key = "id" if table == "durable_workflow_run" else "run_id"
            listed = ", ".join(f'"{c}"' for c in columns)
            with cursor.copy(f"COPY (SELECT {listed} FROM {table} WHERE {key} = '{run.pk}') TO STDOUT") as copy:
                text = b"".join(bytes(data) for data in copy).decode()
            rows[table] = (columns, text.splitlines())
    WorkflowRun.objects.filter(pk=run.pk).delete()
    return rows, str(run.pk)


def load(runs: int, steps: int, days: int, first_id: int = 0, chunk: int = 20_000) -> float:
    """COPY `runs` finished runs like the template into the tables (`first_id` numbers their ids),
    created and finished over the last `days` (each a minute after it was created); return the
    seconds it took. Each id carries its run's creation time, as a UUIDv7 would; where the runs
    are partitioned, that time is the run's id_time, and where the journal is, each entry carries
    its run's creation time as its partition key, as the engine writes them."""
    rows, pk = template(steps)
    run_columns = rows["durable_workflow_run"][0]
    finished_column, created_column = run_columns.index("finished_at"), run_columns.index("created_at")
    id_time_column = run_columns.index("id_time")
    step_columns = rows["durable_step"][0]
    keyed = partitioning.layout(refresh=True) is not None
    runs_keyed = partitioning.runs.layout(refresh=True) is not None
    key_column = step_columns.index("run_created_at")
    started = time.perf_counter()
    connection.ensure_connection()
    raw = connection.connection
    span = days * 86400.0
    now = time.time()
    with raw.cursor() as cursor:
        # The rows come from a consistent template: skip the foreign key triggers, which would
        # otherwise check (and lock) the run of every one of 100 million journal rows at commit.
        cursor.execute("SET session_replication_role = replica")
    for table in TABLES:
        columns, lines = rows[table]
        if not lines:
            continue
        listed = ", ".join(f'"{c}"' for c in columns)
        with raw.cursor() as cursor, cursor.copy(f"COPY {table} ({listed}) FROM STDIN") as copy:
            for first in range(0, runs, chunk):
                out = []
                for i in range(first, min(runs, first + chunk)):
                    finished = now - span * (runs - i) / runs
                    created_s = int(finished - 60)
                    created = time.strftime("%Y-%m-%d %H:%M:%S+00", time.gmtime(created_s))
                    # A UUIDv7 of its creation time (to the second), numbered: unique, and in order.
                    new = str(uuid.UUID(int=(created_s * 1000) << 80 | 7 << 76 | 2 << 62 | first_id + i + 1))
                    if table == "durable_workflow_run":
                        fields = lines[0].replace(pk, new).split("\t")
                        fields[finished_column] = time.strftime("%Y-%m-%d %H:%M:%S+00", time.gmtime(finished))
                        fields[created_column] = created
                        if runs_keyed:
                            fields[id_time_column] = created
                        out.append("\t".join(fields))
                    elif table == "durable_step" and keyed:
                        for line in lines:
                            fields = line.replace(pk, new).split("\t")
                            fields[key_column] = created
                            out.append("\t".join(fields))
                    else:
                        out.extend(line.replace(pk, new) for line in lines)
                copy.write("\n".join(out) + "\n")
        if not connection.get_autocommit():
            raw.commit()
        log(f"  {table}: {runs * len(lines):,} rows")
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = DEFAULT")
        for table in TABLES:
            cursor.execute(f"ANALYZE {table}")
    return time.perf_counter() - started


# -- what is measured -----------------------------------------------------------------------------


def w1(runs: int, steps: int, processes: int) -> float:
    """Steps per second of `runs` workflows of `steps` steps, drained by `processes` workers."""
    ids = [durable.start("bench.ten_steps", n=steps).pk for _ in range(runs)]
    connections.close_all()
    subprocess.run(worker_command("--burst", "-c", str(processes), "-v", "0"), env=worker_env(), check=True, cwd=ROOT)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FILTER (WHERE status = 'completed'), "
                       "EXTRACT(EPOCH FROM max(finished_at) - min(started_at)) FROM durable_workflow_run "
                       "WHERE id = ANY(%s)", [ids])
        completed, elapsed = cursor.fetchone()
        assert completed == runs, completed
    WorkflowRun.objects.filter(pk__in=ids).delete()
    return runs * steps / float(elapsed)


def w2(runs: int) -> float:
    """p50 milliseconds from start() to the result on an idle worker."""
    connections.close_all()
    worker = subprocess.Popen(worker_command("-c", "1", "-v", "0"), env=worker_env(), cwd=ROOT)
    ids, times = [], []
    try:
        time.sleep(2.0)
        for _ in range(runs):
            started = time.perf_counter()
            run = durable.start("bench.one_step")
            durable.wait(run.pk, timeout=60)
            times.append(time.perf_counter() - started)
            ids.append(run.pk)
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    WorkflowRun.objects.filter(pk__in=ids).delete()
    return 1000 * statistics.median(times), 1000 * quantile(times, 0.95)


def admin(loads: int) -> dict:
    user, _ = get_user_model().objects.get_or_create(
        username="bench-admin", defaults={"is_staff": True, "is_superuser": True})
    client = Client()
    client.force_login(user)
    oldest = WorkflowRun.objects.order_by("created_at").values_list("pk", flat=True).first()
    return {name: measure(client, url, loads)["p50_ms"] for name, url in (
        ("run list", "/admin/django_durable/workflowrun/"),
        ("run list, failed", "/admin/django_durable/workflowrun/?status=failed"),
        ("overview", "/admin/django_durable/overview/"),
        ("the oldest run's page", f"/admin/django_durable/workflowrun/{oldest}/change/"))}


# A table's name, its partitions counted as the journal's or the runs'.
TABLE_OF = ("CASE WHEN relname LIKE 'durable\\_step\\_%%' THEN 'durable_step' "
            "WHEN relname LIKE 'durable\\_workflow\\_run\\_%%' THEN 'durable_workflow_run' ELSE relname END")


def dead() -> dict:
    time.sleep(1.5)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {TABLE_OF} AS t, sum(n_live_tup)::bigint, sum(n_dead_tup)::bigint "
                       f"FROM pg_stat_user_tables WHERE {TABLE_OF} = ANY(%s) GROUP BY t ORDER BY t", [TABLES])
        return {name: (live, dead) for name, live, dead in cursor.fetchall()}


def sizes() -> dict:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {TABLE_OF} AS t, sum(pg_total_relation_size(oid))::bigint FROM pg_class "
                       f"WHERE relkind = 'r' AND {TABLE_OF} = ANY(%s) GROUP BY t", [TABLES])
        return {name: size for name, size in cursor.fetchall()}


def figures(args) -> dict:
    rounds = [{"W1 steps/s": w1(args.w1_runs, 10, args.processes), "W2 p50 ms": w2(args.w2_runs)[0],
               **admin(args.loads)} for _ in range(args.repeat)]
    return {name: statistics.median(r[name] for r in rounds) for name in rounds[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--base-runs", type=int, default=1000, help="the runs of the 'empty' database")
    parser.add_argument("--days", type=int, default=300, help="the history's finish times spread over this")
    parser.add_argument("--prune-share", type=float, default=0.1, help="the oldest share the prune deletes")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--w1-runs", type=int, default=500)
    parser.add_argument("--w2-runs", type=int, default=100)
    parser.add_argument("--loads", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--partitioned", action="store_true",
                        help="the journal in monthly partitions (PartitionJournal); the prune then drops them")
    parser.add_argument("--partitioned-runs", action="store_true",
                        help="with --partitioned: the runs table too (PartitionRuns)")
    parser.add_argument("--retention-prune", action="store_true",
                        help="prune as the nightly durable.prune does (each workflow's retention, DURABLE_RETENTION "
                             "30 days: partitions dropped whole), not the oldest --prune-share")
    parser.add_argument("--measure-only", action="store_true",
                        help="only measure the database as it is (another sample after a run)")
    args = parser.parse_args()
    if args.partitioned_runs and not args.partitioned:
        parser.error("--partitioned-runs goes with --partitioned")
    if args.measure_only:
        log(f"as it is: {figures(args)}")
        return
    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {', '.join(TABLES)}, durable_timer, durable_signal CASCADE")
    if args.partitioned:  # monthly partitions since before the history began, as after a year in use
        since = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=args.days + 2)
        partitioning.convert(connection.alias, "month", since=since)
        log(f"partitioned: {len(partitioning.partitions())} monthly partitions")
        if args.partitioned_runs:
            partitioning.runs.convert(connection.alias, "month", since=since)
            log(f"runs partitioned: {len(partitioning.runs.partitions())} monthly partitions")
    out = {"args": vars(args) | {"json": str(args.json)}}
    # "Empty" still has a page of runs, so that both lists render as many rows.
    load(args.base_runs, args.steps, 1)
    log(f"empty: {args.base_runs} runs")
    out["empty"] = figures(args)
    log(f"  {out['empty']}")
    log(f"loading {args.runs:,} runs of {args.steps} steps")
    out["load_s"] = load(args.runs, args.steps, args.days, first_id=args.base_runs)
    out["sizes"] = sizes()
    log(f"  {out['load_s']:.0f} s; {out['sizes']}")
    out["history"] = figures(args)
    log(f"history {out['history']}")
    out["dead_before_prune"] = dead()
    started = time.perf_counter()
    age = int(args.days * (1 - args.prune_share))
    run_partitions = [p.name for p in partitioning.runs.partitions()]
    if args.retention_prune:
        call_command("durable", "prune", "--batch", "1000", stdout=io.StringIO())
    else:
        call_command("durable", "prune", "--older-than", f"{age}d", "--batch", "1000", stdout=io.StringIO())
    out["prune_s"] = time.perf_counter() - started
    out["run_partitions_dropped"] = sorted(set(run_partitions) - {p.name for p in partitioning.runs.partitions()})
    log(f"run partitions dropped: {out['run_partitions_dropped']}")
    out["dead_after_prune"] = dead()
    out["partitions_after_prune"] = len(partitioning.partitions())
    log(f"prune {out['prune_s']:.0f} s; dead {out['dead_after_prune']}; sizes {sizes()}")
    started = time.perf_counter()
    with connection.cursor() as cursor:
        for table in TABLES:
            cursor.execute(f"VACUUM (ANALYZE) {table}")
    out["vacuum_s"] = time.perf_counter() - started
    out["dead_after_vacuum"] = dead()
    log(f"vacuum {out['vacuum_s']:.0f} s; dead {out['dead_after_vacuum']}")
    out["pruned"] = figures(args)
    log(f"pruned {out['pruned']}")
    print()
    print(f"{'':32}{'empty':>10}{'history':>10}{'ratio':>8}{'pruned':>10}{'ratio':>8}")
    for name, empty in out["empty"].items():
        history, pruned = out["history"][name], out["pruned"][name]
        print(f"{name:32}{empty:10.1f}{history:10.1f}{history / empty:8.2f}{pruned:10.1f}{pruned / empty:8.2f}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, default=str))


if __name__ == "__main__":
    main()
