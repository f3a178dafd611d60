"""The worker: ``manage.py durable_worker`` runs processes of Worker, each a main loop that claims
and runs one item at a time and a maintenance thread (heartbeats, the reaper, timers, schedules).

- process.py: the Worker, its main loop and its exit; waiter.py: waiting for work (LISTEN, polling);
- maintenance.py: the second thread; connection.py: what both threads share about the database;
- supervisor.py: the parent that starts worker processes and replaces those that die;
- reloader.py: ``--reload`` for development; machine.py: whether another worker's process is gone.

Above the engine and the workpool: nothing below imports this package. Its names load lazily, so
that the supervisor and the reloader (parents of workers) do not load the engine themselves.
"""

__all__ = ["DB_ERRORS", "EXIT_REPLACE", "LIMITED_POLL", "Backoff", "RunDamaged", "Waiter", "Worker",
           "close_connection", "process_name", "refused", "report_lost"]


def __getattr__(name: str):
    if name in ("DB_ERRORS", "Backoff", "close_connection", "report_lost"):
        from . import connection as module
    elif name == "Waiter":
        from . import waiter as module
    elif name in __all__:
        from . import process as module
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(module, name)
