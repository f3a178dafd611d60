"""W5 on django-durable: enqueue N one-step django.tasks tasks one at a time (DurableBackend),
then drain them with P worker processes (`durable_worker --burst -c P`). With --ceiling, the raw
SKIP LOCKED ceiling on N rows instead (bench/run.py's plain psycopg loop).

    DATABASE_URL=URL .venv/bin/python bench/peers/durable_w5.py --jobs N --processes P [--ceiling]
"""

from __future__ import annotations

import os
import sys
from importlib.metadata import version

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import run as harness  # noqa: E402  (sets Django up on bench.settings)
from common import analyze, argument, busy_seconds, report, report_w5, run_workers, timed_enqueue  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection, connections  # noqa: E402


def main() -> None:
    jobs, processes = int(argument("jobs", 5000)), int(argument("processes", 2))
    call_command("migrate", verbosity=0)
    if "--ceiling" in sys.argv:
        before = busy_seconds()
        rate = harness.raw_ceiling(jobs, processes)
        report({"system": "ceiling", "jobs": jobs, "drain_per_s": rate,
                "cpu_ms_per_job": 1000 * (busy_seconds() - before) / jobs})
        return
    from bench.benchapp.tasks import one_step

    harness.truncate()
    enqueue_per_s = timed_enqueue(lambda n: one_step.enqueue(n), jobs)
    connections.close_all()
    analyze(os.environ["DATABASE_URL"])
    drained = run_workers([harness.worker_command("--burst", "-c", str(processes), "-v", "0")],
                          env=harness.worker_env())
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FILTER (WHERE status = 'completed'), "
                       "EXTRACT(EPOCH FROM max(finished_at) - min(started_at)) FROM durable_workflow_run")
        done, seconds = cursor.fetchone()
        cursor.execute("SELECT count(*) FROM durable_step")
        (journal,) = cursor.fetchone()
    assert journal == 0, f"{journal} journal entries: a task should write none"
    report_w5("django-durable", version("django-durable-workflows"), jobs, done, seconds, enqueue_per_s, drained)


if __name__ == "__main__":
    main()
