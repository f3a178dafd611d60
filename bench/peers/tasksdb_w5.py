"""W5 on django-tasks-db (Django 6's django.tasks with the database backend of django-tasks):
enqueue N one-step tasks one at a time, then drain them with P `db_worker --batch` processes.

    bench/.venvs/tasks-db/bin/python bench/peers/tasksdb_w5.py --url URL --jobs N --processes P
"""

from __future__ import annotations

from importlib.metadata import version

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

from common import analyze, argument, report_w5, run_workers, timed_enqueue  # noqa: E402

URL = os.environ.get("TASKSDB_URL") or argument("url", "")


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


def main() -> None:
    setup()
    from django.core.management import call_command
    from django.db import connection
    from tasksdb_tasks import one_step

    if sys.argv[1:2] == ["worker"]:
        call_command("db_worker", "--batch", "--no-startup-delay", "--interval", "0.1", verbosity=0)
        return
    jobs, processes = int(argument("jobs", 5000)), int(argument("processes", 2))
    call_command("migrate", verbosity=0)
    enqueue_per_s = timed_enqueue(lambda n: one_step.enqueue(n), jobs)
    connection.close()
    env = {"TASKSDB_URL": URL, "PYTHONPATH": os.path.dirname(__file__)}
    analyze(URL)
    drained = run_workers([[sys.executable, __file__, "worker"]] * processes, env=env)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FILTER (WHERE status = 'SUCCESSFUL'), "
                       "EXTRACT(EPOCH FROM max(finished_at) - min(started_at)) FROM django_tasks_database_dbtaskresult")
        done, seconds = cursor.fetchone()
    report_w5("django-tasks-db", version("django-tasks-db"), jobs, done, seconds, enqueue_per_s, drained)


if __name__ == "__main__":
    main()
