"""Procrastinate's side of `make bench-peers` (W5 and W2; it has no workflows for W1 and W3).

    bench/.venvs/procrastinate/bin/python bench/peers/procrastinate_driver.py --url URL [--workload w5|w2] --jobs N --processes P

W5: N one-step jobs enqueued one at a time, then drained by P `worker --one-shot` processes.
W2: one job at a time on an idle worker (which listens for new jobs).
"""

from __future__ import annotations

from importlib.metadata import version

import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))

import procrastinate  # noqa: E402
from common import analyze, argument, latency_w2, report_w5, run_workers, serving, timed_enqueue  # noqa: E402

URL = os.environ.get("PROCRASTINATE_URL") or argument("url", "")
app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=URL))
ENV = {"PROCRASTINATE_URL": URL, "PYTHONPATH": os.path.dirname(__file__)}
CLI = [sys.executable, "-m", "procrastinate", "--app=procrastinate_driver.app"]


@app.task(name="one_step")
def one_step(n):
    return n


def w5(jobs: int, processes: int) -> None:
    with app.open():
        enqueued = timed_enqueue(lambda n: one_step.defer(n=n), jobs)
        analyze(URL)
        drained = run_workers([[*CLI, "worker", "--concurrency", "1", "--one-shot"]] * processes, env=ENV)
    import psycopg

    with psycopg.connect(URL) as connection:
        (done,) = connection.execute(
            "SELECT count(*) FILTER (WHERE status = 'succeeded') FROM procrastinate_jobs").fetchone()
        window = connection.execute(
            "SELECT EXTRACT(EPOCH FROM min(at) FILTER (WHERE type = 'started')), "
            "EXTRACT(EPOCH FROM max(at) FILTER (WHERE type = 'succeeded')) FROM procrastinate_events").fetchone()
    report_w5("procrastinate", version("procrastinate"), jobs, done, window, enqueued, drained)


def w2(jobs: int) -> None:
    import psycopg

    with psycopg.connect(URL, autocommit=True) as connection, app.open(), \
            serving([[*CLI, "worker", "--concurrency", "1"]], env=ENV):
        def finished(job_id) -> bool:
            (status,) = connection.execute("SELECT status FROM procrastinate_jobs WHERE id = %s", [job_id]).fetchone()
            return status in ("succeeded", "failed")

        def server_seconds():
            return [row[0] for row in connection.execute(
                "SELECT EXTRACT(EPOCH FROM max(at) FILTER (WHERE type = 'succeeded') "
                "- min(at) FILTER (WHERE type = 'deferred')) FROM procrastinate_events GROUP BY job_id ORDER BY job_id")]

        latency_w2("procrastinate", version("procrastinate"), jobs, lambda n: one_step.defer(n=n), finished,
                   server_seconds)


def main() -> None:
    workload = argument("workload", "w5")
    jobs, processes = int(argument("jobs", 5000)), int(argument("processes", 2))
    subprocess.run([*CLI, "schema", "--apply"], env={**os.environ, **ENV}, check=True, capture_output=True)
    {"w5": lambda: w5(jobs, processes), "w2": lambda: w2(jobs)}[workload]()


if __name__ == "__main__":
    main()
