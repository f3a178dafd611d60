"""Starting runs and waiting for them."""

from __future__ import annotations

import datetime as dt
import functools
import logging
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError, connections, transaction
from django.utils import timezone

from .. import clock, conf, registry, serialization
from ..exceptions import WaitTimeout, WorkflowFailed, WorkflowNotFound
from ..ids import run_pk
from ..models import WorkflowEvent, WorkflowRun
from ..workpool import listening, postgres, queries
from ..workpool import runs as _runs
from ..workpool.runs import create_run, subject_key
from . import gates

logger = logging.getLogger("django_durable")

__all__ = ["create_run", "get_run", "resolve_run_id", "start", "start_and_wait", "start_many", "start_run", "wait"]


def start(
    workflow: str | Callable,
    /,
    *args: Any,
    idempotency_key: str | None = None,
    queue: str | None = None,
    priority: int | None = None,
    run_at: dt.datetime | None = None,
    delay: dt.timedelta | float | None = None,
    concurrency_key: str | None = None,
    subject: Any = None,
    singleton: str | None = None,
    debounce: tuple | None = None,
    throttle: tuple | None = None,
    **kwargs: Any,
) -> WorkflowRun:
    """Create a run of `workflow` with these arguments and return it (a WorkflowRun).

    Inside the caller's ``transaction.atomic()`` the run commits or rolls back with the
    caller. With an `idempotency_key`, a second start of the same workflow with the same key
    returns the first run instead of creating another (decided by a unique constraint). With
    `run_at` (an aware datetime) or `delay` (a timedelta or seconds) the run exists at once,
    ``pending``, and starts at that time. Runs with one `concurrency_key` (a tenant, a user) share
    their queue's ``key_concurrency`` (DURABLE_QUEUES). `subject` (a saved model instance) is what
    the run is about: runs_for(obj) finds its runs, and its admin page can show them. Raise
    WorkflowNotFound for an unregistered workflow, NotSerializable or PayloadTooLarge for arguments
    that cannot be stored, ValueError for a bad option, SubjectBusy for a second unfinished run of
    a one_at_a_time workflow for one subject; nothing is written then.

    Gated by a key (one of, services/gates.py): `singleton=key` keeps one unfinished run per key
    (a second start returns it, or raises SingletonBusy where the workflow says
    singleton_busy="refuse"); `debounce=(key, period)` starts the run once the key has been quiet
    for the period (seconds or a timedelta), with the last call's input, every call before that
    returning the same pending run; `throttle=(key, limit, period)` lets at most `limit` runs of
    the key become ready in any window of `period`, delaying the others (never dropping them).
    """
    return start_run(workflow, args, kwargs, idempotency_key=idempotency_key, queue=queue, priority=priority,
                     run_at=run_at, delay=delay, concurrency_key=concurrency_key, subject=subject,
                     singleton=singleton, debounce=debounce, throttle=throttle)


def start_many(workflow: str | Callable, calls, /, *, queue: str | None = None,
               priority: int | None = None, concurrency_key: str | None = None) -> list[uuid.UUID]:
    """Start a run of `workflow` for each item of `calls` and return their ids, in order.

    Each item is a dict of keyword arguments or a list (or tuple) of positional ones. For a
    backfill or a fan-in from outside a workflow: the runs are stored in one statement per
    5,000 (on PostgreSQL), ready at once, on `queue` with `priority` (else the workflow's).
    Inside the caller's ``transaction.atomic()`` they commit or roll back with it. Every item
    is checked first; one that is refused raises (naming its index) and nothing is stored.
    """
    return _runs.start_many(registry.get(workflow), calls, queue=queue, priority=priority,
                            concurrency_key=concurrency_key)


def start_run(
    workflow: str | Callable,
    args: list | tuple = (),
    kwargs: dict | None = None,
    *,
    idempotency_key: str | None = None,
    queue: str | None = None,
    priority: int | None = None,
    run_at: dt.datetime | None = None,
    delay: dt.timedelta | float | None = None,
    by: str | None = None,
    concurrency_key: str | None = None,
    subject: Any = None,
    singleton: str | None = None,
    debounce: tuple | None = None,
    throttle: tuple | None = None,
) -> WorkflowRun:
    """start() with the arguments as a list and a dict, for callers that hold them as data.

    The admin, the REST API and the command line start runs here; `by` (who started it)
    goes into the run's audit trail. Raise as start() does, and TypeError for `args` that is
    not a list or `kwargs` that is not a dict with string keys.
    """
    definition = registry.get(workflow)
    kwargs = {} if kwargs is None else kwargs
    if not isinstance(args, (list, tuple)):
        raise TypeError(f"The arguments must be a list, not {type(args).__name__}.")
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise TypeError("The keyword arguments must be an object with string keys.")
    if run_at is not None and delay is not None:
        raise ValueError("Give run_at or delay, not both.")
    if run_at is not None and (not isinstance(run_at, dt.datetime) or timezone.is_naive(run_at)):
        raise ValueError(f"run_at must be an aware datetime, not {run_at!r}.")
    if delay is not None:
        # Counted on the database's clock, like every timer, not this process's.
        seconds = clock.seconds(delay, "delay")
        run_at = clock.database_now(conf.get("DATABASE")) + dt.timedelta(seconds=seconds)
    gate = gates.options(singleton, debounce, throttle)
    make = create_run if gate is None else functools.partial(gates.start, gate=gate)
    if by is None:
        run = make(definition, list(args), kwargs, idempotency_key=idempotency_key, queue=queue,
                   priority=priority, run_at=run_at, concurrency_key=concurrency_key, subject=subject)
    else:
        db = conf.get("DATABASE")
        with transaction.atomic(using=db):
            run = make(definition, list(args), kwargs, idempotency_key=idempotency_key, queue=queue,
                       priority=priority, run_at=run_at, concurrency_key=concurrency_key, subject=subject)
            if getattr(run, "created_now", True):
                WorkflowEvent.record(run.pk, WorkflowEvent.Type.STARTED, by=by, db=db)
    warning = unknown_queue(queue)
    if warning:
        run.warning = warning  # shown by the REST API and the command line
        logger.warning("Run %s of %s: %s", run.pk, definition.name, warning)
    return run


def warn_if_unserved(run: WorkflowRun) -> WorkflowRun:
    """`run`, its `warning` saying no worker will take it (no_worker()) unless it has a warning of
    its own or has finished: for a person who started or waits for it and is shown the warning (the
    REST API, the command line), not for every start."""
    if getattr(run, "warning", None) is None and not run.is_finished:
        run.warning = no_worker(run.queue)
    return run


def unknown_queue(queue: str | None) -> str | None:
    """A warning when `queue` (given to a start) is neither in DURABLE_QUEUES, nor a registered
    workflow's own, nor served by a live worker: most likely a typo, and the run would wait for ever."""
    from .. import stats

    known = {*(conf.get("QUEUES") or {}), *(definition.queue for definition in registry.definitions())}
    if queue is None or queue in known or not stats.unserved_queues([queue]):
        return None
    return (f"No live worker serves the queue {queue!r}, and neither DURABLE_QUEUES nor a workflow names it "
            f"(known queues: {', '.join(sorted(known))}): the run waits until a worker takes that queue "
            f"(durable_worker --queues {queue}).")


async def astart(workflow: str | Callable, /, *args: Any, **kwargs: Any) -> WorkflowRun:
    """start(), from async code (an async view): on Django's thread for sync database work."""
    from asgiref.sync import sync_to_async

    return await sync_to_async(start, thread_sensitive=True)(workflow, *args, **kwargs)


async def await_result(run_id, timeout: float | None = None) -> Any:
    """wait(), from async code: the waiting happens on a thread of its own (it may take long, and
    must not hold up the thread Django's other sync work shares), whose connection is closed after."""
    from asgiref.sync import sync_to_async

    def waiting():
        try:
            return wait(run_id, timeout=timeout)
        finally:
            connections[conf.get("DATABASE")].close()

    return await sync_to_async(waiting, thread_sensitive=False)()


def runs_for(subject, *, workflow: str | Callable | None = None):
    """The runs started for `subject` (a model instance), newest first, as a WorkflowRun queryset;
    with `workflow`, only that workflow's."""
    content_type, pk = subject_key(subject, "runs_for()'s subject")
    runs = WorkflowRun.objects.using(conf.get("DATABASE")).filter(subject_type=content_type, subject_id=pk)
    if workflow is not None:
        runs = runs.filter(workflow=registry.get(workflow).name)
    return runs.order_by("-created_at")


def get_run(run_id) -> WorkflowRun:
    """Return the run with this id; raise WorkflowNotFound (without a query for a non-UUID)."""
    pk = run_pk(run_id)
    try:
        return WorkflowRun.objects.using(conf.get("DATABASE")).get(pk=pk)
    except WorkflowRun.DoesNotExist:
        raise WorkflowNotFound(f"No workflow run has the id {str(run_id)[:80]!r}.") from None


def wait(run_id, timeout: float | None = None) -> Any:
    """Return the result of the run once it completes.

    Raise WorkflowFailed if it ends failed or cancelled, WaitTimeout if `timeout` seconds pass
    first (the run goes on), WorkflowNotFound for an unknown id. On PostgreSQL it listens for
    the run's end (the worker that finishes a run someone waits for announces it with NOTIFY)
    and looks again now and then in case a notification was missed; elsewhere it polls with a
    short, growing interval. Call it outside transactions, since a run started in an open
    transaction is invisible to workers until that transaction commits.
    """
    db = conf.get("DATABASE")
    if connections[db].in_atomic_block:
        raise RuntimeError(
            "durable.wait() was called inside transaction.atomic(): a run started in this "
            "transaction is invisible to workers until it commits, so the wait could never end. "
            "Wait after the transaction commits (transaction.on_commit) or outside it."
        )
    pk = run_pk(run_id)
    deadline = None if timeout is None else time.monotonic() + timeout
    if conf.listens(db):
        with _Listening(db, pk) as listening:
            return _wait(pk, db, deadline, timeout, look=listening.look, pause=listening.pause,
                         first=LISTENING_FIRST_PAUSE)
    return _wait(pk, db, deadline, timeout, look=lambda: _state(pk, db), pause=time.sleep, first=0.002)


# wait(): seconds between two looks at the run, growing from the first to the longest. Listening,
# a notification ends a pause early, so the looks are only a safety net.
LISTENING_FIRST_PAUSE, LONGEST_PAUSE = 0.1, 0.5


def _wait(pk, db, deadline, timeout, *, look, pause, first) -> Any:
    """Look at the run until it ends or the deadline passes; pause(seconds) between looks,
    `first` and then growing to LONGEST_PAUSE."""
    delay = first
    while True:
        status, result, error, queue = look()
        if status == WorkflowRun.Status.COMPLETED:
            return serialization.decode(result)
        if status in WorkflowRun.TERMINAL:
            raise WorkflowFailed(pk, status, serialization.decode(error))
        if deadline is not None and time.monotonic() >= deadline:
            hint = no_worker(queue, db)
            raise WaitTimeout(f"Workflow run {pk} did not finish within {timeout} seconds; it is {status}."
                              + (f" {hint}" if hint else ""), run_id=pk, hint=hint)
        pause(delay if deadline is None else min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 1.5, LONGEST_PAUSE)


def _state(pk, db) -> tuple:
    row = WorkflowRun.objects.using(db).filter(pk=pk).values_list("status", "result", "error", "queue").first()
    if row is None:
        raise WorkflowNotFound(f"No workflow run has the id {pk}.")
    return row


class _Listening:
    """wait() on PostgreSQL: LISTEN for the ends of runs someone waits for, mark this run as
    waited for, and sleep until its notification (or a pause's end) instead of polling.

    The mark and the worker's end of the run both update the run's row, so one of them sees the
    other: either the worker sees the mark and notifies, or the look that set the mark sees the
    run ended. A cancel, a forced failure and the reaper announce the ends they write too; a
    notification lost on the way (a pooler) is made up for by the next look, after a pause
    growing to half a second.
    """

    def __init__(self, db, pk):
        self.db, self.pk, self.payload = db, pk, str(pk)
        # The session that listens: the durable database's, or DURABLE_LISTEN_DATABASE's where
        # that one goes through a transaction pooler (the looks still go through the pooler).
        self.listens_on = conf.get("LISTEN_DATABASE") or db
        self.marked = self.heard = False

    def __enter__(self):
        connection = connections[self.listens_on]
        with connection.cursor() as cursor:
            cursor.execute(f"LISTEN {queries.DONE_CHANNEL}")
        self.raw = connection.connection
        return self

    def __exit__(self, *exc_info):
        connection = connections[self.listens_on]
        if connection.connection is self.raw and not self.raw.closed:
            try:
                with connection.cursor() as cursor:
                    cursor.execute(f"UNLISTEN {queries.DONE_CHANNEL}")
            except DatabaseError:
                connection.close()  # a new session listens to nothing

    def look(self) -> tuple:
        self.heard = False
        if self.marked:
            return _state(self.pk, self.db)
        with connections[self.db].cursor() as cursor:
            cursor.execute(queries.AWAIT.format(**postgres.run_parts()), [self.pk, *postgres.given_run(self.pk)])
            row = cursor.fetchone()
        if row is None:
            raise WorkflowNotFound(f"No workflow run has the id {self.pk}.")
        self.marked = True
        return row

    def pause(self, seconds: float) -> None:
        """Sleep until this run's notification, at most `seconds` (notifications of other runs
        go on by). psycopg keeps those that came during a statement for the next notifies()."""
        self.heard = self.heard or listening.heard(self.raw, self.payload, seconds)


def no_worker(run_queue: str, db: str | None = None) -> str | None:
    """Why a wait may be in vain, or None: no live worker serves the run's queue (the commonest
    first-hour surprise). The one sentence wait() (WaitTimeout.hint, which `durable start --wait`
    says) and warn_if_unserved() (the REST start, result/?wait=, `durable start`) give."""
    from ..models import Worker
    from ..stats import live_workers_since

    live = Worker.objects.using(db or conf.get("DATABASE")).filter(stopped_at__isnull=True,
                                                                  last_seen__gte=live_workers_since())
    queues = list(live.values_list("queues", flat=True)[:100])
    if any(not served or run_queue in served.split(",") for served in queues):
        return None
    if not queues:
        return "No worker is running: start one with `python manage.py durable_worker`."
    return f"No live worker serves its queue {run_queue!r}: start one with `durable_worker --queues {run_queue}`."


def start_and_wait(workflow: str | Callable, /, *args: Any, timeout: float | None = None, return_run: bool = False,
                   **kwargs: Any) -> Any:
    """Start a run (as start()) and return its result (as wait()).

    With ``return_run=True``, return the finished WorkflowRun instead (its id, times and
    ``get_result()``). Either way the exceptions name the run: WorkflowFailed and WaitTimeout
    carry its ``run_id``.
    """
    run = start(workflow, *args, **kwargs)
    result = wait(run.pk, timeout=timeout)
    if not return_run:
        return result
    return WorkflowRun.objects.using(conf.get("DATABASE")).get(pk=run.pk)


SHORT_ID = re.compile(r"^[0-9a-fA-F]{6,31}$")


def resolve_run_id(text: str) -> uuid.UUID:
    """A run's id from its whole UUID, or from its end as the admin shows it (the last 6 to 31
    hex digits: a UUIDv7 starts with the clock, so its end tells runs apart). Raise
    WorkflowNotFound if no run, or more than one, ends that way."""
    if not SHORT_ID.match(text or ""):
        return run_pk(text)
    ids = list(WorkflowRun.objects.using(conf.get("DATABASE")).filter(id__iendswith=text.lower())
               .values_list("id", flat=True)[:2])
    if len(ids) != 1:
        raise WorkflowNotFound(
            f"No workflow run has an id ending in {text!r}." if not ids else
            f"More than one workflow run has an id ending in {text!r}; give more of it."
        )
    return ids[0]


