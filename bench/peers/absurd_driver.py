"""django-absurd's side of `make bench-peers` (W5, W2 and W1: its tasks are durable workflows of steps).

    bench/.venvs/absurd/bin/python bench/peers/absurd_driver.py --url URL [--workload w5|w2|w1] --jobs N --processes P

django-absurd (a `django.tasks` backend on Absurd's SQL, Django 6, psycopg) installed as its
README says: the app, its TASKS backend, `migrate`. Its worker is `absurd_worker`, here with
`--batch-size 10` (ten runs claimed a round trip, run one after another: its fast path for a task
that does no I/O) and `--poll-interval 0.1` (0.25 s by default). It has no drain mode, so for W5
and W1 each worker process stops itself (SIGTERM, which lets what it claimed finish) once no run
is pending or running. W1: N tasks of ten `context.step()` calls each (absurd_tasks.py). Times are
its runs' own columns, written by PostgreSQL's clock.
"""

from __future__ import annotations

import os
import sys
from importlib.metadata import version

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import analyze, argument, latency_w2, report_w1, report_w5, run_workers, serving, timed_enqueue  # noqa: E402

URL = os.environ.get("PEER_URL") or argument("url", "")
WORKER = ["absurd_worker", "--batch-size", "10", "--poll-interval", "0.1"]
RUNS = "absurd.r_default"


def setup() -> None:
    from urllib.parse import urlsplit

    import django
    from django.conf import settings

    parts = urlsplit(URL)
    settings.configure(
        INSTALLED_APPS=["django.contrib.contenttypes", "django_absurd"],
        DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", "NAME": parts.path.lstrip("/"),
                               "USER": parts.username, "HOST": parts.hostname, "PORT": parts.port}},
        TASKS={"default": {"BACKEND": "django_absurd.backends.AbsurdBackend"}},
        USE_TZ=True, LOGGING_CONFIG=None,
    )
    django.setup()


def _env() -> dict:
    return {"PEER_URL": URL, "PYTHONPATH": os.path.dirname(os.path.abspath(__file__))}


def _drain(processes: int) -> dict:
    from django.db import connection

    connection.close()
    analyze(URL)
    return run_workers([[sys.executable, os.path.abspath(__file__), "worker", "--drain"]] * processes, env=_env(),
                       url=URL)


def _window() -> tuple:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FILTER (WHERE state = 'completed'), EXTRACT(EPOCH FROM min(started_at)), "
                       f"EXTRACT(EPOCH FROM max(completed_at)) FROM {RUNS}")
        done, *window = cursor.fetchone()
    return done, window


def w5(jobs: int, processes: int) -> None:
    from peer_tasks import one_step

    enqueued = timed_enqueue(lambda n: one_step.enqueue(n), jobs)
    drained = _drain(processes)
    done, window = _window()
    report_w5("django-absurd", version("django-absurd"), jobs, done, window, enqueued, drained)


def w1(jobs: int, processes: int) -> None:
    from absurd_tasks import ten_steps

    for n in range(jobs):
        ten_steps.enqueue(n)
    drained = _drain(processes)
    done, window = _window()
    report_w1("django-absurd", version("django-absurd"), jobs, done, window, drained)


def w2(jobs: int) -> None:
    from django.db import connection
    from peer_tasks import one_step

    def finished(result_id) -> bool:
        return one_step.get_result(result_id).status in ("SUCCESSFUL", "FAILED")

    def server_seconds():
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT EXTRACT(EPOCH FROM completed_at - created_at) FROM {RUNS} ORDER BY created_at")
            return [row[0] for row in cursor.fetchall()]

    with serving([[sys.executable, os.path.abspath(__file__), "worker"]], env=_env()):
        latency_w2("django-absurd", version("django-absurd"), jobs, lambda n: one_step.enqueue(n).id, finished,
                   server_seconds)


def worker(drain: bool) -> None:
    """`absurd_worker` as WORKER runs it; with `drain`, it stops itself once no run is left."""
    import signal
    import threading
    import time

    import psycopg
    from django.core.management import call_command

    def watch():
        with psycopg.connect(URL.replace("postgres://", "postgresql://", 1), autocommit=True) as connection:
            while True:
                time.sleep(0.05)
                (left,) = connection.execute(
                    f"SELECT count(*) FROM {RUNS} WHERE state IN ('pending', 'running')").fetchone()
                if left == 0:
                    os.kill(os.getpid(), signal.SIGTERM)
                    return

    if drain:
        threading.Thread(target=watch, daemon=True).start()
    # Its banner and its line a task (its default logging, kept) would follow the driver's figures
    # on the driver's standard output: they go to /dev/null instead.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    call_command(*WORKER, verbosity=0)


def main() -> None:
    setup()
    if sys.argv[1:2] == ["worker"]:
        worker("--drain" in sys.argv)
        return
    from django.core.management import call_command

    workload = argument("workload", "w5")
    jobs, processes = int(argument("jobs", 5000)), int(argument("processes", 2))
    call_command("migrate", verbosity=0)
    {"w5": lambda: w5(jobs, processes), "w2": lambda: w2(jobs), "w1": lambda: w1(jobs, processes)}[workload]()


if __name__ == "__main__":
    main()
