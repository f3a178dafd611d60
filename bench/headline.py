"""The figures docs/performance.md opens with, on PostgreSQL or SQLite (DATABASE_URL).

    DATABASE_URL=postgres://... python bench/headline.py [--rounds 3]
    DATABASE_URL=sqlite:////tmp/headline.sqlite3 python bench/headline.py [--rounds 3]

Each round, on emptied tables: `start()` one at a time (wall p50) and `start_many()` (runs/s),
in this process; a short run's end to end (`start()` until `wait()` returns, p50, with one
idle worker process running); 2,000 ten-step workflows and 5,000 `django.tasks` tasks drained by
one `durable_worker --burst -c 2` (steps/s and tasks/s, from the first start to the last end by
the database's clock); on PostgreSQL, the one-statement ceiling of bench/run.py in the same round
(plain psycopg claiming and completing a row per statement), the machine's speed that round.
Prints the medians of the rounds as JSON, and each round's figures.
SQLite runs with the options getting started gives it (IMMEDIATE transactions, WAL).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection, connections  # noqa: E402
from django.db.models import Max, Min  # noqa: E402

import django_durable as durable  # noqa: E402
from django_durable.models import Step, Timer, WorkflowEvent, WorkflowRun, WorkItem  # noqa: E402


def empty() -> None:
    for model in (Step, Timer, WorkflowEvent, WorkItem, WorkflowRun):
        model.objects.all().delete()
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE" if connection.vendor == "sqlite" else
                       "VACUUM ANALYZE durable_work_item, durable_workflow_run, durable_step")


def drained_per_second(count: int) -> float:
    """`count` (runs or steps) over the span from the first run's start to the last one's end."""
    span = WorkflowRun.objects.aggregate(began=Min("started_at"), ended=Max("finished_at"))
    unfinished = WorkflowRun.objects.exclude(status="completed").count()
    assert unfinished == 0, f"{unfinished} run(s) did not complete"
    return count / (span["ended"] - span["began"]).total_seconds()


def burst(processes: int) -> None:
    connections.close_all()
    subprocess.run([sys.executable, str(ROOT / "manage.py"), "durable_worker", "--burst", "-c", str(processes),
                    "-v", "0"], env={**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings"}, cwd=ROOT, check=True)


def one_round(args) -> dict:
    figures = {}
    empty()
    walls = []
    for _ in range(args.starts):
        began = time.perf_counter()
        durable.start("bench.one_step")
        walls.append(time.perf_counter() - began)
    figures["start_p50_ms"] = 1000 * statistics.median(walls)
    empty()
    began = time.perf_counter()
    durable.start_many("bench.one_step", [{} for _ in range(args.many)])
    figures["start_many_runs_per_s"] = args.many / (time.perf_counter() - began)

    empty()
    connections.close_all()
    worker = subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "durable_worker", "-c", "1", "-v", "0"],
                              env={**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings"}, cwd=ROOT)
    try:
        durable.wait(durable.start("bench.one_step").pk, timeout=120)  # the worker is up
        ends = []
        for _ in range(args.short_runs):
            began = time.perf_counter()
            durable.wait(durable.start("bench.one_step").pk, timeout=60)
            ends.append(time.perf_counter() - began)
        figures["short_run_p50_ms"] = 1000 * statistics.median(ends)
    finally:
        worker.terminate()
        worker.wait(timeout=60)

    empty()
    for _ in range(args.workflows):
        durable.start("bench.ten_steps", n=10)
    burst(args.processes)
    figures["ten_step_steps_per_s"] = drained_per_second(args.workflows * 10)

    from bench.benchapp.tasks import one_step

    empty()
    for n in range(args.tasks):
        one_step.enqueue(n)
    burst(args.processes)
    figures["tasks_per_s"] = drained_per_second(args.tasks)
    if connection.vendor == "postgresql":  # how fast the machine and the server are in this round
        from bench.run import raw_ceiling

        figures["ceiling_rows_per_s"] = raw_ceiling(10_000, args.processes)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--starts", type=int, default=1000)
    parser.add_argument("--many", type=int, default=20000)
    parser.add_argument("--short-runs", type=int, default=200)
    parser.add_argument("--workflows", type=int, default=2000)
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    rounds = []
    for number in range(args.rounds):
        rounds.append(one_round(args))
        print(f"round {number + 1}: " + json.dumps({k: round(v, 2) for k, v in rounds[-1].items()}), file=sys.stderr)
    medians = {key: round(statistics.median(r[key] for r in rounds), 2) for key in rounds[0]}
    print(json.dumps({"database": connection.vendor, "python": platform.python_version(), "django": django.__version__,
                      "cores": os.cpu_count(), "medians": medians,
                      "rounds": [{k: round(v, 2) for k, v in r.items()} for r in rounds]}, indent=1))


if __name__ == "__main__":
    main()
