"""Starting runs and waiting for them."""

from __future__ import annotations

import datetime as dt
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

from django.db import connections, transaction
from django.db.models import DateTimeField, ExpressionWrapper, Value
from django.utils import timezone

from .. import clock, conf, registry, serialization, workpool
from ..exceptions import WaitTimeout, WorkflowFailed, WorkflowNotFound
from ..models import Timer, WorkflowEvent, WorkflowRun, WorkItem


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


def create_run(definition, args: list, kwargs: dict, *, idempotency_key=None, queue=None, priority=None,
               run_id=None, parent_id=None, run_at=None, detached=False) -> WorkflowRun:
    """Validate and store a run of `definition` with its work item (and deadline); return it.

    A run with a given `run_id` that exists already is returned as it is: a child's id is
    derived from its parent, so starting it again changes nothing. A run with `run_at` waits
    for a timer to start it.
    """
    definition.check_arguments(args, kwargs)
    text = serialization.encode(
        {"args": list(args), "kwargs": kwargs}, what="input", max_bytes=conf.get("MAX_PAYLOAD_BYTES")
    )
    queue_name = _check_queue(queue or definition.queue)
    priority = definition.priority if priority is None else _check_priority(priority)
    if idempotency_key is not None and (not isinstance(idempotency_key, str) or not 0 < len(idempotency_key) <= 255):
        raise ValueError(f"idempotency_key must be a string of 1 to 255 characters, not {idempotency_key!r}.")
    db = conf.get("DATABASE")
    run = WorkflowRun(
        workflow=definition.name,
        input=text,
        queue=queue_name,
        priority=priority,
        idempotency_key=idempotency_key,
        max_attempts=definition.max_attempts,
        parent_id=parent_id,
        detached=detached,
        scheduled_at=run_at,
        waiting_on=f"starts at {run_at:%Y-%m-%d %H:%M:%S %Z}" if run_at is not None else "",
    )
    if run_id is not None:
        run.id = run_id
    with transaction.atomic(using=db):
        if idempotency_key is None and run_id is None:
            run.save(force_insert=True, using=db)
        else:
            # ON CONFLICT DO NOTHING: of two concurrent starts with one key (or id), the second
            # waits for the first to commit and then inserts nothing; both read back one row.
            WorkflowRun.objects.using(db).bulk_create([run], ignore_conflicts=True)
            if run_id is not None:
                existing = WorkflowRun.objects.using(db).get(pk=run_id)
                if WorkItem.objects.using(db).filter(run_id=run_id, kind=WorkItem.Kind.ADVANCE).exists():
                    return existing  # created before, with its work item, in one transaction
            else:
                existing = WorkflowRun.objects.using(db).get(workflow=definition.name, idempotency_key=idempotency_key)
                if existing.pk != run.pk:
                    existing.created_now = False  # the first start's run (the API answers 200, not 201)
                    return existing
            run = existing
        WorkItem.objects.using(db).create(
            kind=WorkItem.Kind.ADVANCE, run=run, queue=queue_name, priority=priority, available_at=clock.db_now(),
            # A delayed run's item stays idle until its timer wakes it.
            status=WorkItem.Status.PENDING if run_at is None else WorkItem.Status.COMPLETED,
        )
        if run_at is not None:
            Timer.objects.using(db).create(kind=Timer.Kind.DELAYED_START, run=run, fire_at=run_at)
        if definition.timeout is not None:
            _set_deadline(run, definition.timeout, db, run_at)
        workpool.notify(db)
    return run


def _set_deadline(run: WorkflowRun, timeout, db: str, run_at=None) -> None:
    """The run ends timed_out at its start (creation, or run_at) + timeout; a timer wakes it then."""
    if run_at is not None:
        deadline = run_at + timeout
    else:
        deadline = ExpressionWrapper(clock.db_now() + Value(timeout), output_field=DateTimeField())
    WorkflowRun.objects.using(db).filter(pk=run.pk).update(deadline_at=deadline)
    run.refresh_from_db(fields=["deadline_at"])
    Timer.objects.using(db).create(kind=Timer.Kind.DEADLINE, run=run, fire_at=run.deadline_at)


def _check_queue(name: Any) -> str:
    if not isinstance(name, str) or not 0 < len(name) <= 100:
        raise ValueError(f"A queue name must be a string of 1 to 100 characters, not {name!r}.")
    return name


def _check_priority(priority: Any) -> int:
    if type(priority) is not int or not -(2**31) <= priority < 2**31:
        raise ValueError(f"priority must be an integer (higher runs first), not {priority!r}.")
    return priority


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
    run_queue = WorkflowRun.objects.using(db).filter(pk=run.pk).values_list("queue", flat=True).first()
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


