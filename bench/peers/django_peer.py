"""The side of `make bench-peers` of a `django.tasks` database backend on Django 6 (W5 and W2; they
have no workflows for W1 and W3): django-tasks-db (tasksdb_driver.py) and django-ox (ox_driver.py)
each describe themselves with a Peer and call main().

W5: N one-step tasks enqueued one at a time, then drained by P worker processes, each in its
batch mode (one process each: neither runs several processes in that mode). W2: one task at a
time on an idle worker; neither has LISTEN, so its worker polls (at the interval the Peer names).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from importlib.metadata import version

from common import analyze, argument, latency_w2, report_w5, run_workers, serving, timed_enqueue

URL = os.environ.get("PEER_URL") or argument("url", "")


@dataclass(frozen=True)
class Peer:
    name: str  # as reported, and its distribution's name
    app: str  # its Django app
    backend: str  # its TASKS backend
    table: str  # its results' table: status, enqueued_at, started_at, finished_at
    worker: list[str]  # its worker command and the options every run of it takes
    batch: str  # the option that makes its worker exit once the queue is empty
    database: dict = field(default_factory=dict)  # extra DATABASES["default"] settings


def setup(peer: Peer) -> None:
    from urllib.parse import urlsplit

    import django
    from django.conf import settings

    parts = urlsplit(URL)
    settings.configure(
        INSTALLED_APPS=["django.contrib.contenttypes", peer.app],
        DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", "NAME": parts.path.lstrip("/"),
                               "USER": parts.username, "HOST": parts.hostname, "PORT": parts.port,
                               **peer.database}},
        TASKS={"default": {"BACKEND": peer.backend}},
        USE_TZ=True, LOGGING_CONFIG=None,
    )
    django.setup()


def w5(peer: Peer, script: str, jobs: int, processes: int) -> None:
    from django.db import connection
    from peer_tasks import one_step

    enqueued = timed_enqueue(lambda n: one_step.enqueue(n), jobs)
    connection.close()
    analyze(URL)
    drained = run_workers([[sys.executable, script, "worker", peer.batch]] * processes, env=_env(), url=URL)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FILTER (WHERE status = 'SUCCESSFUL'), "
                       f"EXTRACT(EPOCH FROM min(started_at)), EXTRACT(EPOCH FROM max(finished_at)) FROM {peer.table}")
        done, *window = cursor.fetchone()
    report_w5(peer.name, version(peer.name), jobs, done, window, enqueued, drained)


def w2(peer: Peer, script: str, jobs: int) -> None:
    from django.db import connection
    from peer_tasks import one_step

    def finished(result_id) -> bool:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT status IN ('SUCCESSFUL', 'FAILED') FROM {peer.table} WHERE id = %s", [result_id])
            return cursor.fetchone()[0]

    def server_seconds():
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT EXTRACT(EPOCH FROM finished_at - enqueued_at) FROM {peer.table} ORDER BY enqueued_at")
            return [row[0] for row in cursor.fetchall()]

    with serving([[sys.executable, script, "worker"]], env=_env()):
        latency_w2(peer.name, version(peer.name), jobs, lambda n: one_step.enqueue(n).id, finished, server_seconds)


def _env() -> dict:
    return {"PEER_URL": URL, "PYTHONPATH": os.path.dirname(os.path.abspath(__file__))}


def main(peer: Peer, script: str) -> None:
    setup(peer)
    from django.core.management import call_command

    if sys.argv[1:2] == ["worker"]:
        call_command(*peer.worker, *sys.argv[2:], verbosity=0)
        return
    workload = argument("workload", "w5")
    jobs, processes = int(argument("jobs", 5000)), int(argument("processes", 2))
    call_command("migrate", verbosity=0)
    {"w5": lambda: w5(peer, script, jobs, processes), "w2": lambda: w2(peer, script, jobs)}[workload]()
