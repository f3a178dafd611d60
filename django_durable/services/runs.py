"""Starting runs and waiting for them."""

from __future__ import annotations

import datetime as dt
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

from django.db import connections, transaction
from django.utils import timezone

from .. import clock, conf, registry
from ..exceptions import WaitTimeout, WorkflowFailed, WorkflowNotFound
from ..models import WorkflowEvent, WorkflowRun
from ..workpool.runs import create_run

__all__ = ["create_run", "get_run", "resolve_run_id", "start", "start_and_wait", "start_run", "wait"]


def start(
    workflow: str | Callable,
    /,
    *args: Any,
    idempotency_key: str | None = None,
    queue: str | None = None,
    priority: int | None = None,
    run_at: dt.datetime | None = None,
    delay: dt.timedelta | float | None = None,
    **kwargs: Any,
) -> WorkflowRun:
    """Create a run of `workflow` with these arguments and return it (a WorkflowRun).

    Inside the caller's ``transaction.atomic()`` the run commits or rolls back with the
    caller. With an `idempotency_key`, a second start of the same workflow with the same key
    returns the first run instead of creating another (decided by a unique constraint). With
    `run_at` (an aware datetime) or `delay` (a timedelta or seconds) the run exists at once,
    ``pending``, and starts at that time. Raise WorkflowNotFound for an unregistered workflow,
    NotSerializable or PayloadTooLarge for arguments that cannot be stored, ValueError for a bad
    option; nothing is written then.
    """
    return start_run(workflow, args, kwargs, idempotency_key=idempotency_key, queue=queue, priority=priority,
                     run_at=run_at, delay=delay)


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
    if by is None:
        return create_run(definition, list(args), kwargs, idempotency_key=idempotency_key, queue=queue,
                          priority=priority, run_at=run_at)
    from . import audit

    db = conf.get("DATABASE")
    with transaction.atomic(using=db):
        run = create_run(definition, list(args), kwargs, idempotency_key=idempotency_key, queue=queue,
                         priority=priority, run_at=run_at)
        audit.record(run.pk, WorkflowEvent.Type.STARTED, by=by, db=db)
    return run


def get_run(run_id) -> WorkflowRun:
    """Return the run with this id; raise WorkflowNotFound (without a query for a non-UUID)."""
    pk = _run_pk(run_id)
    try:
        return WorkflowRun.objects.using(conf.get("DATABASE")).get(pk=pk)
    except WorkflowRun.DoesNotExist:
        raise WorkflowNotFound(f"No workflow run has the id {str(run_id)[:80]!r}.") from None


def wait(run_id, timeout: float | None = None) -> Any:
    """Return the result of the run once it completes.

    Raise WorkflowFailed if it ends failed or cancelled, WaitTimeout if `timeout` seconds pass
    first (the run goes on), WorkflowNotFound for an unknown id. Polls with a short, growing
    interval; call it outside transactions, since a run started in an open transaction is
    invisible to workers until that transaction commits.
    """
    db = conf.get("DATABASE")
    if connections[db].in_atomic_block:
        raise RuntimeError(
            "durable.wait() was called inside transaction.atomic(): a run started in this "
            "transaction is invisible to workers until it commits, so the wait could never end. "
            "Wait after the transaction commits (transaction.on_commit) or outside it."
        )
    run = get_run(run_id)
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = 0.002
    while True:
        if run.status == WorkflowRun.Status.COMPLETED:
            return run.get_result()
        if run.status in WorkflowRun.TERMINAL:
            raise WorkflowFailed(run.pk, run.status, run.get_error())
        if deadline is not None and time.monotonic() >= deadline:
            raise WaitTimeout(f"Workflow run {run.pk} did not finish within {timeout} seconds; it is {run.status}."
                              + _no_worker_hint(run, db))
        pause = delay if deadline is None else min(delay, max(0.0, deadline - time.monotonic()))
        time.sleep(pause)
        delay = min(delay * 1.5, 0.5)
        run.refresh_from_db(fields=["status", "result", "error"])


def _no_worker_hint(run: WorkflowRun, db: str) -> str:
    """Why a wait may be in vain: no live worker serves the run's queue (the commonest first-hour surprise)."""
    from ..models import Worker
    from ..stats import live_workers_since

    live = Worker.objects.using(db).filter(stopped_at__isnull=True, last_seen__gte=live_workers_since())
    queues = list(live.values_list("queues", flat=True)[:100])
    run_queue = run.queue
    if any(not served or run_queue in served.split(",") for served in queues):
        return ""
    if not queues:
        return " No worker is running: start one with `python manage.py durable_worker`."
    return f" No live worker serves its queue {run_queue!r}: start one with `durable_worker --queues {run_queue}`."


def start_and_wait(workflow: str | Callable, /, *args: Any, timeout: float | None = None, **kwargs: Any) -> Any:
    """Start a run (as start()) and return its result (as wait())."""
    run = start(workflow, *args, **kwargs)
    return wait(run.pk, timeout=timeout)


SHORT_ID = re.compile(r"^[0-9a-fA-F]{6,31}$")


def resolve_run_id(text: str) -> uuid.UUID:
    """A run's id from its whole UUID, or from its end as the admin shows it (the last 6 to 31
    hex digits: a UUIDv7 starts with the clock, so its end tells runs apart). Raise
    WorkflowNotFound if no run, or more than one, ends that way."""
    if not SHORT_ID.match(text or ""):
        return _run_pk(text)
    ids = list(WorkflowRun.objects.using(conf.get("DATABASE")).filter(id__iendswith=text.lower())
               .values_list("id", flat=True)[:2])
    if len(ids) != 1:
        raise WorkflowNotFound(
            f"No workflow run has an id ending in {text!r}." if not ids else
            f"More than one workflow run has an id ending in {text!r}; give more of it."
        )
    return ids[0]


def _run_pk(run_id) -> uuid.UUID:
    try:
        return run_id if isinstance(run_id, uuid.UUID) else uuid.UUID(str(run_id))
    except ValueError:
        raise WorkflowNotFound(f"No workflow run has the id {str(run_id)[:80]!r}.") from None


