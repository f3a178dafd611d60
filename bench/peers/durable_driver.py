"""django-durable's side of `make bench-peers`, and the raw SKIP LOCKED ceiling (--ceiling).

    DATABASE_URL=URL .venv/bin/python bench/peers/durable_driver.py [--workload w5|w2|w1|w3] [--ceiling]

W5: N one-step django.tasks tasks (DurableBackend) enqueued one at a time, then drained by P worker
processes (`durable_worker --burst -c P`); with --workflows, N one-step workflows (a journal entry
each) instead. W2: one task at a time on an idle worker. W1: N ten-step
workflows drained by P processes. W3: one workflow mapping a step over N items, P processes. Steady: jobs at --rate a second for
--seconds while a snapshot is held (make bench-horizon, bench/horizon.py).
The ceiling is bench/run.py's plain psycopg loop over N rows: one UPDATE ... WHERE id = (SELECT ...
FOR UPDATE SKIP LOCKED LIMIT 1) RETURNING a row in autocommit, or with --loop four-trips the
transaction of a SELECT and an UPDATE that earlier figures were measured against.
"""

from __future__ import annotations

import os
import sys
from importlib.metadata import version

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import run as harness  # noqa: E402  (sets Django up on bench.settings)
from common import (  # noqa: E402
    analyze, argument, busy_seconds, latency_w2, postmaster, report, report_w1, report_w5, run_workers, serving,
    steady, system_cpu, timed_enqueue, wait_until,
)
from django.core.management import call_command  # noqa: E402
from django.db import connection, connections, transaction  # noqa: E402

VERSION = version("django-durable-workflows")
# The workers' settings: the project's own (bench.settings), or with --worker-settings
# bench.worker_settings, the project less the apps that only serve requests (docs/workers.md).
WORKER_SETTINGS = argument("worker-settings", "bench.settings")


def _worker_env() -> dict:
    return harness.worker_env(DJANGO_SETTINGS_MODULE=WORKER_SETTINGS)


def _drain(processes: int) -> tuple[dict, int, list]:
    """ANALYZE (unless --no-analyze), then `durable_worker --burst -c P` until the queue is empty:
    run_workers()'s figures, the runs completed, and the first start and last end (epoch seconds)."""
    connections.close_all()
    analyze(os.environ["DATABASE_URL"])
    drained = run_workers([harness.worker_command("--burst", "-c", str(processes), "-v", "0")],
                          env=_worker_env())
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FILTER (WHERE status = 'completed'), "
                       "EXTRACT(EPOCH FROM min(started_at)), EXTRACT(EPOCH FROM max(finished_at)) FROM durable_workflow_run")
        done, *window = cursor.fetchone()
    return drained, done, window


def w5(jobs: int, processes: int, workflows: bool = False) -> None:
    import django_durable as durable
    from bench.benchapp.tasks import one_step

    harness.truncate()
    enqueue = (lambda n: durable.start("bench.one_step")) if workflows else (lambda n: one_step.enqueue(n))
    enqueued = timed_enqueue(enqueue, jobs)
    drained, done, window = _drain(processes)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM durable_step")
        (journal,) = cursor.fetchone()
    assert journal == (jobs if workflows else 0), f"{journal} journal entries for {jobs} runs"
    report_w5("django-durable-workflows" if workflows else "django-durable", VERSION, jobs, done, window,
              enqueued, drained)


def w1(workflows: int, processes: int) -> None:
    """N ten-step workflows drained by P processes (bench/run.py's W1, with the CPU a step)."""
    import django_durable as durable

    harness.truncate()
    for _ in range(workflows):
        durable.start("bench.ten_steps", n=10)
    drained, done, window = _drain(processes)
    report_w1("django-durable", VERSION, workflows, done, window, drained)


def w2(jobs: int) -> None:
    from bench.benchapp.tasks import one_step

    harness.truncate()
    connections.close_all()

    def finished(result_id) -> bool:
        with connection.cursor() as cursor:
            cursor.execute("SELECT status IN ('completed', 'failed') FROM durable_workflow_run WHERE id = %s",
                           [result_id])
            return cursor.fetchone()[0]

    def server_seconds():
        with connection.cursor() as cursor:
            cursor.execute("SELECT EXTRACT(EPOCH FROM finished_at - created_at) FROM durable_workflow_run "
                           "ORDER BY created_at")
            return [row[0] for row in cursor.fetchall()]

    with serving([harness.worker_command("-c", "1", "-v", "0")], env=_worker_env()):
        latency_w2("django-durable", VERSION, jobs, lambda n: one_step.enqueue(n).id, finished, server_seconds)


def steady_load(rate: float, seconds: float, processes: int, hold_at: float, hold_for: float, mix: bool) -> None:
    """A steady load (make bench-horizon): one-step tasks, and with --mix every tenth job a ten-step
    workflow instead, at `rate` a second, on `processes` workers, while a snapshot is held."""
    import django_durable as durable
    from bench.benchapp.tasks import one_step

    harness.truncate()

    def enqueue(n: int) -> None:
        if mix and n % 10 == 9:
            durable.start("bench.ten_steps", n=10)
        else:
            one_step.enqueue(n)

    def jobs() -> list:
        with connection.cursor() as cursor:
            cursor.execute("SELECT EXTRACT(EPOCH FROM created_at), EXTRACT(EPOCH FROM started_at), "
                           "EXTRACT(EPOCH FROM finished_at) FROM durable_workflow_run")
            return cursor.fetchall()

    with serving([harness.worker_command("-c", str(processes), "-v", "0")], env=_worker_env()):
        for n in range(20):  # the workers up and their statements prepared before the clock starts
            enqueue(n)
        wait_until(lambda: all(finished is not None for _, _, finished in jobs()), timeout=120, every=0.1)
        harness.truncate()
        def enqueue_many(numbers) -> None:  # one commit: a statement for the tasks, one for the workflows
            with transaction.atomic():
                durable.start_many(one_step.module_path, [[n] for n in numbers if not (mix and n % 10 == 9)])
                if mix and (workflows := [{"n": 10} for n in numbers if n % 10 == 9]):
                    durable.start_many("bench.ten_steps", workflows)

        steady("django-durable" + (" (tasks and ten-step workflows)" if mix else ""), VERSION,
               os.environ["DATABASE_URL"], enqueue_many, rate, seconds, hold_at, hold_for,
               ["durable_work_item", "durable_workflow_run", "durable_step"], jobs)


def main() -> None:
    workload = argument("workload", "w5")
    jobs, processes = int(argument("jobs", 5000)), int(argument("processes", 2))
    call_command("migrate", verbosity=0)
    if "--ceiling" in sys.argv:
        # Over the whole loop, with the table's creation: a little more than its drain alone.
        loop = argument("loop", "one-statement")
        roots = [postmaster(os.environ["DATABASE_URL"]), os.getpid()]
        machine, own = busy_seconds(), system_cpu(roots)
        rate = harness.raw_ceiling(jobs, processes, loop)
        report({"system": "ceiling" if loop == "one-statement" else f"ceiling ({loop})", "jobs": jobs,
                "drain_per_s": rate,
                "cpu_ms_per_job": 1000 * (system_cpu(roots) - own) / jobs,
                "machine_cpu_ms_per_job": 1000 * (busy_seconds() - machine) / jobs})
    elif workload == "w5":
        w5(jobs, processes, workflows="--workflows" in sys.argv)
    elif workload == "w2":
        w2(jobs)
    elif workload == "w1":
        w1(jobs, processes)
    elif workload == "steady":
        steady_load(float(argument("rate", 500)), float(argument("seconds", 600)), processes,
                    float(argument("hold-at", 120)), float(argument("hold-for", 300)), "--mix" in sys.argv)
    elif workload == "w3":
        harness.w3_fanout([jobs], processes)
        with connection.cursor() as cursor:  # by the database's clock, as for the peers
            cursor.execute("SELECT EXTRACT(EPOCH FROM finished_at - created_at) FROM durable_workflow_run")
            (seconds,) = cursor.fetchone()
        report({"system": "django-durable", "version": VERSION, "items": jobs, "seconds": float(seconds)})
    else:
        raise SystemExit(f"unknown workload {workload!r}")


if __name__ == "__main__":
    main()
