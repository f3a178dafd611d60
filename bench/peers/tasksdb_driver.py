"""django-tasks-db's side of `make bench-peers` (Django 6's django.tasks with the database backend
of django-tasks; W5 and W2, it has no workflows for W1 and W3).

    bench/.venvs/tasks-db/bin/python bench/peers/tasksdb_driver.py --url URL [--workload w5|w2] --jobs N --processes P

W5: N one-step tasks enqueued one at a time, then drained by P `db_worker --batch` processes.
W2: one task at a time on an idle `db_worker`. Its workers poll (every 0.1 s here, 1 s by default):
it has no LISTEN.
"""

from __future__ import annotations

from importlib.metadata import version

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

from common import analyze, argument, latency_w2, report_w5, run_workers, serving, timed_enqueue  # noqa: E402

URL = os.environ.get("TASKSDB_URL") or argument("url", "")
ENV = {"TASKSDB_URL": URL, "PYTHONPATH": os.path.dirname(__file__)}
TABLE = "django_tasks_database_dbtaskresult"


def setup() -> None:
    from urllib.parse import urlsplit

    import django
    from django.conf import settings

    parts = urlsplit(URL)
    settings.configure(
        INSTALLED_APPS=["django.contrib.contenttypes", "django_tasks_db"],
        DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", "NAME": parts.path.lstrip("/"),
                               "USER": parts.username, "HOST": parts.hostname, "PORT": parts.port}},
        TASKS={"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}},
        USE_TZ=True, LOGGING_CONFIG=None,
    )
    django.setup()


def w5(jobs: int, processes: int) -> None:
    from django.db import connection
    from tasksdb_tasks import one_step

    enqueue_per_s = timed_enqueue(lambda n: one_step.enqueue(n), jobs)
    connection.close()
    analyze(URL)
    drained = run_workers([[sys.executable, __file__, "worker", "--batch"]] * processes, env=ENV)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FILTER (WHERE status = 'SUCCESSFUL'), "
                       f"EXTRACT(EPOCH FROM min(started_at)), EXTRACT(EPOCH FROM max(finished_at)) FROM {TABLE}")
        done, *window = cursor.fetchone()
    report_w5("django-tasks-db", version("django-tasks-db"), jobs, done, window, enqueue_per_s, drained)


def w2(jobs: int) -> None:
    from django.db import connection
    from tasksdb_tasks import one_step

    def finished(result_id) -> bool:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT status IN ('SUCCESSFUL', 'FAILED') FROM {TABLE} WHERE id = %s", [result_id])
            return cursor.fetchone()[0]

    def server_seconds():
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT EXTRACT(EPOCH FROM finished_at - enqueued_at) FROM {TABLE} ORDER BY enqueued_at")
            return [row[0] for row in cursor.fetchall()]

    with serving([[sys.executable, __file__, "worker"]], env=ENV):
        latency_w2("django-tasks-db", version("django-tasks-db"), jobs, lambda n: one_step.enqueue(n).id, finished,
                   server_seconds)


def main() -> None:
    setup()
    from django.core.management import call_command

    if sys.argv[1:2] == ["worker"]:
        call_command("db_worker", *sys.argv[2:], "--no-startup-delay", "--interval", "0.1", verbosity=0)
        return
    workload = argument("workload", "w5")
    jobs, processes = int(argument("jobs", 5000)), int(argument("processes", 2))
    call_command("migrate", verbosity=0)
    {"w5": lambda: w5(jobs, processes), "w2": lambda: w2(jobs)}[workload]()


if __name__ == "__main__":
    main()
