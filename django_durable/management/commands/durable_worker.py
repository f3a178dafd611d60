"""manage.py durable_worker: run worker processes that advance workflow runs."""

from __future__ import annotations

import gc
import logging
import os
import sys

from django.core.management.base import BaseCommand, CommandError

from django_durable import startup
from django_durable.worker.connection import find_dead_peers
from django_durable.worker.process import shutdown_grace
from django_durable.worker.supervisor import Supervisor
from django_durable.worker import Worker


class Command(BaseCommand):
    help = "Run durable workflow workers until stopped (SIGTERM or Ctrl-C stops them gracefully)."
    # A worker runs django-durable's own checks (its settings, its database, the workflows), not
    # the whole project's: those load the URLs, and with them the REST framework and everything
    # the views import, which a worker never serves (half its start-up, and memory in each process).
    requires_system_checks: list[str] = []

    def add_arguments(self, parser):
        parser.add_argument(
            "--concurrency", "-c", type=int, default=os.cpu_count() or 1,
            help="Number of worker processes (default: the number of CPUs).",
        )
        parser.add_argument(
            "--queues", "-q", default="",
            help="Comma-separated queues to take work from (default: all queues).",
        )
        parser.add_argument(
            "--burst", action="store_true",
            help="Exit once no work is ready and none is in progress.",
        )
        parser.add_argument("--skip-checks", action="store_true", help="Skip django-durable's system checks.")
        parser.add_argument("--name", default=None, help="Worker name shown in claims and logs.")
        parser.add_argument(
            "--reload", action="store_true",
            help="Development only: restart the worker when a Python file of the project changes.",
        )
        parser.add_argument(
            "--grace", type=float, default=None,
            help="Seconds a stopping worker lets its running step finish before releasing it "
            "(default: DURABLE_SHUTDOWN_GRACE_SECONDS).",
        )

    def handle(self, *args, concurrency, queues, burst, name, grace, verbosity, reload, **options):
        if concurrency < 1:
            raise CommandError(f"--concurrency must be at least 1, not {concurrency}.")
        if grace is not None and grace < 0:
            raise CommandError(f"--grace must not be negative, not {grace}.")
        _configure_logging(verbosity)
        if not options.get("skip_checks"):
            from django_durable import conf

            self.check(tags=["durable"], databases=[conf.get("DATABASE")])
        if reload:
            startup.release_collector()  # this process only watches files
            if burst:
                raise CommandError("--reload keeps a worker running; it does not go with --burst.")
            from django_durable.worker.reloader import Reloader, project_root, worker_command

            sys.exit(Reloader(worker_command(), project_root(), grace=shutdown_grace(grace)).run())
        worker_options = {
            "queues": [q.strip() for q in queues.split(",") if q.strip()] or None,
            "burst": burst,
            "name": name,
            "grace": grace,
        }
        # This process's connections, and those of the worker processes it forks, notice a
        # database gone silent within seconds (a worker run in-process elsewhere is left alone).
        find_dead_peers()
        # What start-up made (Django, the project's modules and models, its workflows) lives as
        # long as the process: out of the collector's sight, the collections a drain triggers do
        # not walk it again each time (about half their cost: 14 µs of a task's 100 µs before),
        # and worker processes forked from here keep sharing its pages instead of writing to
        # every one at their first full collection.
        gc.freeze()
        startup.release_collector()
        if concurrency == 1:
            code = Worker(**worker_options).run()
        else:
            code = Supervisor(concurrency, **worker_options).run()
        sys.exit(code)


def _configure_logging(verbosity: int) -> None:
    """Show the worker's INFO lines (and the WARNINGs of other loggers) on stderr, each with the run
    and step it is about, unless the project configured its own logging."""
    logger = logging.getLogger("django_durable")
    if logger.handlers or logging.getLogger().handlers:
        return
    from ... import conf
    from ...telemetry import JSONFormatter, LogContextFilter, WorkerFormatter

    handler = logging.StreamHandler()
    handler.addFilter(WorkerLines())
    handler.addFilter(NotPrintedAlready())
    handler.addFilter(LogContextFilter())  # also on the lines of the project's own loggers (its steps)
    handler.setFormatter(JSONFormatter() if conf.get("LOG_FORMAT") == "json" else WorkerFormatter())
    # On the root logger: the lines steps write through their own loggers get the run's context too.
    logging.getLogger().addHandler(handler)
    logging.getLogger().setLevel(logging.WARNING)
    logger.setLevel({0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG))


class WorkerLines(logging.Filter):
    """django-durable's own lines at the worker's verbosity; other loggers' at WARNING and above.
    Django's default LOGGING enables its "django" loggers at INFO (django.tasks' line for every
    task's start and end among them) and writes them only under DEBUG: this handler on the root
    logger does not print them either."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.drops(record.name, record.levelno)

    @staticmethod
    def drops(name: str, level: int) -> bool:
        """Whether every record of logger `name` at `level` is left out (telemetry.emits asks)."""
        return level < logging.WARNING and name != "django_durable" and not name.startswith("django_durable.")


class NotPrintedAlready(logging.Filter):
    """Leave out a line that a console handler on its way up has printed already: Django's own
    "console" handler prints the "django" loggers' lines under DEBUG (django.tasks' among them),
    and the line then reaches this handler on the root logger too."""

    def filter(self, record: logging.LogRecord) -> bool:
        logger = logging.getLogger(record.name)
        while logger is not None and logger.parent is not None:  # up to, not including, the root
            for handler in logger.handlers:
                if (isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)
                        and record.levelno >= handler.level and handler.filter(record)):
                    return False
            if not logger.propagate:
                break
            logger = logger.parent
        return True
