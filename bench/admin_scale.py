"""The admin at scale: every page an operator opens, with each filter of the run list, on a database
holding millions of runs in the partitioned layout.

    DATABASE_URL=postgres://... python bench/admin_scale.py --runs 10000000 [--layout partitioned|plain]

The history is copied in as bench/history.py copies it (one real ten-step run as the template of
each row, finish times over the last 300 days); then a share of it is made failed (with an error),
waiting, paused and unfinished, as a real history has them, and ANALYZEd. Each page is loaded
--loads times through Django's whole request stack as a superuser: the run list with each of its
filters and a search, a failed run's page (with its graph and timeline), the overview, the repair
preview and the work items. For each page: p50 and p95 of the loads, the queries it made, and every
one of those queries EXPLAINed: a sequential scan of the runs, the journal or the work items (a
count of a whole table) is named. The target: every page under a second, none reading a whole table.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")

import django  # noqa: E402

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402

from bench import history  # noqa: E402  (bench/history.py: the copied history)
from bench.admin_pages import measure  # noqa: E402
from django_durable import partitioning  # noqa: E402
from django_durable.models import WorkflowRun  # noqa: E402

HOT = ("durable_workflow_run", "durable_step", "durable_work_item")
LARGE = 50_000  # rows: a table or partition this large read whole is a cost that grows with the history
SHARES = {  # of the history, made so after the copy: (status, waiting_on, error)
    "failed": 0.01, "waiting": 0.001, "paused": 0.0001, "pending": 0.0001,
}


def shape_history(runs: int) -> dict:
    """Make shares of the copied (completed) runs failed, waiting, paused and pending, spread over time."""
    made = {}
    with connection.cursor() as cursor:
        for index, (status, share) in enumerate(SHARES.items()):
            every = max(1, round(1 / share))
            error = ('{"type": "builtins.KeyError", "message": "card declined for order", "traceback": "..."}'
                     if status == "failed" else None)
            waiting = {"waiting": "signal 'approved'", "paused": "an operator: step 'charge' failed 3 times (KeyError)"}
            cursor.execute(
                "UPDATE durable_workflow_run SET status = %s, error = COALESCE(%s, error), waiting_on = %s, "
                "finished_at = CASE WHEN %s IN ('failed') THEN finished_at END "
                "WHERE id IN (SELECT id FROM durable_workflow_run WHERE status = 'completed' "
                "AND abs(hashtext(id::text)) %% %s = %s)",
                [status, error, waiting.get(status, ""), status, every, index])
            made[status] = cursor.rowcount
        cursor.execute("ANALYZE")
    return made


def pages(failed_id, paused_id) -> dict[str, str]:
    base = "/admin/django_durable/workflowrun/"
    now = dt.datetime.now(dt.timezone.utc)
    day = (now - dt.timedelta(days=3)).strftime("%Y-%m-%d")
    return {
        "run list": base,
        "status failed": f"{base}?status__exact=failed",
        "status paused": f"{base}?status__exact=paused",
        "kind tasks": f"{base}?kind=task",
        "workflow": f"{base}?workflow=bench.ten_steps",
        "queue": f"{base}?queue=default",
        "has an error": f"{base}?has_error=yes",
        "created since a day": f"{base}?created_at__gte={day}",
        "waiting for a signal": f"{base}?waiting_for=signal",
        "waiting for an operator": f"{base}?waiting_for=operator",
        "stuck": f"{base}?stuck=any",
        "search by id": f"{base}?q={str(failed_id)[-12:]}",
        "search by workflow": f"{base}?q=bench.ten_steps",
        "failed, sorted by creation": f"{base}?status__exact=failed&o=-1",
        "a failed run's page": f"{base}{failed_id}/change/",
        "a paused run's page": f"{base}{paused_id}/change/",
        "a run's graph": f"{base}{failed_id}/graph/",
        "overview": "/admin/django_durable/overview/",
        "repair preview, failed with an error": f"{base}repair/?preview=1&repair=retry&status=failed&error=declined",
        "work items": "/admin/django_durable/workitem/",
    }


def whole_reads(queries) -> list[str]:
    """The queries (of a page) whose plan reads a large hot table (or partition) whole: a sequential
    scan of one holding more than LARGE rows, not under a LIMIT (which stops it early)."""
    found = []
    with connection.cursor() as cursor:
        cursor.execute("SELECT relname, reltuples FROM pg_class WHERE relkind = 'r' AND reltuples > %s", [LARGE])
        large = {name for name, _ in cursor.fetchall() if name.startswith(HOT)}
        for query in queries:
            sql = query["sql"]
            if not sql.lstrip().upper().startswith("SELECT"):
                continue
            cursor.execute("EXPLAIN (FORMAT JSON) " + sql)
            plan = cursor.fetchone()[0]
            plan = json.loads(plan) if isinstance(plan, str) else plan
            stack = [(plan[0]["Plan"], False)]
            while stack:
                node, limited = stack.pop()
                if node.get("Node Type") == "Seq Scan" and node.get("Relation Name") in large and not limited:
                    found.append(f"{node['Relation Name']}: {sql[:120]}")
                stack.extend((child, limited or node.get("Node Type") == "Limit") for child in node.get("Plans", []))
    return found[:3]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--days", type=int, default=300)
    parser.add_argument("--loads", type=int, default=10)
    parser.add_argument("--layout", choices=["partitioned", "plain"], default="partitioned")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--measure-only", action="store_true", help="measure the database as it is (loaded before)")
    parser.add_argument("--only", default="", help="measure only the pages whose names contain this")
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    made, loaded = {}, 0.0
    if not args.measure_only:
        with connection.cursor() as cursor:
            cursor.execute(f"TRUNCATE {', '.join(history.TABLES)}, durable_timer, durable_signal CASCADE")
        if args.layout == "partitioned":  # monthly partitions since before the history began
            since = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=args.days + 2)
            partitioning.convert(connection.alias, "month", since=since)
            partitioning.runs.convert(connection.alias, "month", since=since)
        history.log(f"loading {args.runs:,} runs of {args.steps} steps ({args.layout})")
        loaded = history.load(args.runs, args.steps, args.days)
        made = shape_history(args.runs)
        history.log(f"  {loaded:.0f} s; made {made}")
    user, _ = get_user_model().objects.get_or_create(username="bench-admin",
                                                     defaults={"is_staff": True, "is_superuser": True})
    client = Client()
    client.force_login(user)
    failed_id = WorkflowRun.objects.filter(status="failed").values_list("pk", flat=True).first()
    paused_id = WorkflowRun.objects.filter(status="paused").values_list("pk", flat=True).first()
    results = {}
    for name, url in pages(failed_id, paused_id).items():
        if args.only not in name:
            continue
        results[name] = measure(client, url, args.loads, explain=whole_reads)
        history.log(f"  {name}: {results[name]['p50_ms']:.1f} ms p50, {results[name]['p95_ms']:.1f} p95, "
                    f"{results[name]['queries']} queries" + (f", WHOLE READS {results[name]['whole_reads']}"
                                                            if results[name]["whole_reads"] else ""))
    print()
    print(f"| page ({args.runs:,} runs, {args.layout}) | p50 | p95 | queries | reads a table whole |")
    print("| --- | --- | --- | --- | --- |")
    for name, figures in results.items():
        print(f"| {name} | {figures['p50_ms']:.1f} ms | {figures['p95_ms']:.1f} ms | {figures['queries']} | "
              f"{'; '.join(figures['whole_reads']) or 'no'} |")
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "made": made,
                                         "load_s": loaded, "pages": results}, indent=2, default=str))


if __name__ == "__main__":
    main()
