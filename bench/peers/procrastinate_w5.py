"""W5 on Procrastinate: enqueue N one-step jobs one at a time, then drain them with P workers.

    bench/.venvs/procrastinate/bin/python bench/peers/procrastinate_w5.py --url URL --jobs N --processes P
"""

from __future__ import annotations

from importlib.metadata import version

import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))

import procrastinate  # noqa: E402
from common import analyze, argument, report_w5, run_workers, timed_enqueue  # noqa: E402

URL = os.environ.get("PROCRASTINATE_URL") or argument("url", "")
app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=URL))


@app.task(name="one_step")
def one_step(n):
    return n


def main() -> None:
    jobs, processes = int(argument("jobs", 5000)), int(argument("processes", 2))
    env = {"PROCRASTINATE_URL": URL, "PYTHONPATH": os.path.dirname(__file__)}
    cli = [sys.executable, "-m", "procrastinate", "--app=procrastinate_w5.app"]
    subprocess.run([*cli, "schema", "--apply"], env={**os.environ, **env}, check=True, capture_output=True)
    with app.open():
        enqueue_per_s = timed_enqueue(lambda n: one_step.defer(n=n), jobs)
        analyze(URL)
        drained = run_workers([[*cli, "worker", "--concurrency", "1", "--one-shot"]] * processes, env=env)
    import psycopg

    with psycopg.connect(URL) as connection:
        (done,) = connection.execute(
            "SELECT count(*) FILTER (WHERE status = 'succeeded') FROM procrastinate_jobs").fetchone()
        (seconds,) = connection.execute(
            "SELECT EXTRACT(EPOCH FROM max(at) FILTER (WHERE type = 'succeeded') "
            "- min(at) FILTER (WHERE type = 'started')) FROM procrastinate_events").fetchone()
    report_w5("procrastinate", version("procrastinate"), jobs, done, seconds, enqueue_per_s, drained)


if __name__ == "__main__":
    main()
