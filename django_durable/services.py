"""Starting and waiting for runs: the functions the Python API, admin, API and CLI all call."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from django.db import connections, transaction

from django.db.models import DateTimeField, ExpressionWrapper, Value

from . import clock, conf, registry, serialization, signals, workpool
from .exceptions import Cancelled, RunFinished, WaitTimeout, WorkflowFailed, WorkflowNotFound
from .models import SignalMessage, Step, Timer, WorkflowRun, WorkItem


def start(
    workflow: str | Callable,
    /,
    *args: Any,
    idempotency_key: str | None = None,
    queue: str | None = None,
    priority: int | None = None,
    **kwargs: Any,
) -> WorkflowRun:
    """Create a run of `workflow` with these arguments and return it (a WorkflowRun).

    Inside the caller's ``transaction.atomic()`` the run commits or rolls back with the
    caller. With an `idempotency_key`, a second start of the same workflow with the same key
    returns the first run instead of creating another (decided by a unique constraint).
    Raise WorkflowNotFound for an unregistered workflow, NotSerializable or PayloadTooLarge
    for arguments that cannot be stored; nothing is written then.
    """
    definition = registry.get(workflow)
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
    )
    with transaction.atomic(using=db):
        if idempotency_key is None:
            run.save(force_insert=True, using=db)
        else:
            # ON CONFLICT DO NOTHING: of two concurrent starts with one key, the second waits
            # for the first to commit and then inserts nothing; both read back the same row.
            WorkflowRun.objects.using(db).bulk_create([run], ignore_conflicts=True)
            existing = WorkflowRun.objects.using(db).get(
                workflow=definition.name, idempotency_key=idempotency_key
            )
            if existing.pk != run.pk:
                return existing
            run = existing
        WorkItem.objects.using(db).create(
            kind=WorkItem.Kind.ADVANCE, run=run, queue=queue_name, priority=priority,
            available_at=clock.db_now(),
        )
        if definition.timeout is not None:
            _set_deadline(run, definition.timeout, db)
        workpool.notify(db)
    return run


def _set_deadline(run: WorkflowRun, timeout, db: str) -> None:
    """The run ends timed_out at creation + timeout: a timer wakes it then, wherever it waits."""
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
            raise WaitTimeout(f"Workflow run {run.pk} did not finish within {timeout} seconds; it is {run.status}.")
        pause = delay if deadline is None else min(delay, max(0.0, deadline - time.monotonic()))
        time.sleep(pause)
        delay = min(delay * 1.5, 0.5)
        run.refresh_from_db(fields=["status", "result", "error"])


def start_and_wait(workflow: str | Callable, /, *args: Any, timeout: float | None = None, **kwargs: Any) -> Any:
    """Start a run (as start()) and return its result (as wait())."""
    run = start(workflow, *args, **kwargs)
    return wait(run.pk, timeout=timeout)


# -- signals, events and cancellation -----------------------------------------------------------
#
# Lock order, as in the workers: the run's work item first, then the run. A claim locks the item
# (skipping locked ones) and then updates the run; taking them the other way round here could
# deadlock with it.


def _lock(pk, db: str) -> WorkflowRun:
    """Lock the run's work item, then the run; return the run or raise WorkflowNotFound."""
    list(
        WorkItem.objects.using(db).filter(run_id=pk, kind=WorkItem.Kind.ADVANCE)
        .select_for_update(no_key=True).values_list("id", flat=True)
    )
    run = WorkflowRun.objects.using(db).select_for_update(no_key=True).filter(pk=pk).first()
    if run is None:
        raise WorkflowNotFound(f"No workflow run has the id {str(pk)!r}.")
    return run


def _run_pk(run_id) -> uuid.UUID:
    try:
        return run_id if isinstance(run_id, uuid.UUID) else uuid.UUID(str(run_id))
    except ValueError:
        raise WorkflowNotFound(f"No workflow run has the id {str(run_id)[:80]!r}.") from None


def _check_name(name, what: str) -> None:
    if not isinstance(name, str) or not 0 < len(name) <= 200:
        raise ValueError(f"A {what} name must be a string of 1 to 200 characters, not {str(name)[:80]!r}.")


def signal(run_id, name: str, payload: Any = None, *, idempotency_key: str | None = None) -> SignalMessage:
    """Send the signal `name` with `payload` to a run; return the stored SignalMessage.

    The run takes it with ``ctx.wait_for_signal(name)``, now or later: signals wait in FIFO
    order. With an `idempotency_key`, sending again returns the first message and stores
    nothing. Raise WorkflowNotFound for an unknown run, RunFinished for a finished one (nothing
    is stored then), NotSerializable or PayloadTooLarge for a payload that cannot be stored.
    """
    _check_name(name, "signal")
    text = serialization.encode(payload, what="signal payload", max_bytes=conf.get("MAX_PAYLOAD_BYTES"))
    pk = _run_pk(run_id)
    db = conf.get("DATABASE")
    with transaction.atomic(using=db):
        run = _lock(pk, db)
        if run.status in WorkflowRun.TERMINAL:
            raise RunFinished(pk, run.status)
        message = SignalMessage(run_id=pk, name=name, payload=text, idempotency_key=idempotency_key)
        if idempotency_key is None:
            message.save(using=db)
        else:
            SignalMessage.objects.using(db).bulk_create([message], ignore_conflicts=True)
            message = SignalMessage.objects.using(db).get(run_id=pk, idempotency_key=idempotency_key)
        workpool.wake([pk], db=db)
    return message


def emit_event(name: str, payload: Any = None) -> int:
    """Deliver the event `name` to every run now waiting for it whose match fits; return how many.

    A wait matches when each of its `match` fields (a dotted path into the payload) equals the
    payload's value. Runs that are not waiting yet never see this event.
    """
    _check_name(name, "event")
    text = serialization.encode(payload, what="event payload", max_bytes=conf.get("MAX_PAYLOAD_BYTES"))
    value = serialization.decode(text)  # compare as the waiting run would see it
    db = conf.get("DATABASE")
    with transaction.atomic(using=db):
        waits = (
            Step.objects.using(db)
            .filter(kind=Step.Kind.EVENT, status=Step.Status.WAITING, name=name)
            .exclude(run__status__in=WorkflowRun.TERMINAL)
            .values_list("run_id", "key", "match")
        )
        targets = [(run_id, key) for run_id, key, match in waits if _matches(serialization.decode(match) or {}, value)]
        SignalMessage.objects.using(db).bulk_create(
            SignalMessage(run_id=run_id, kind=SignalMessage.Kind.EVENT, name=name, payload=text, target_key=key)
            for run_id, key in targets
        )
        if targets:
            workpool.wake([run_id for run_id, _ in targets], db=db)
    return len(targets)


def _matches(match: dict, payload: Any) -> bool:
    missing = object()
    for path, expected in match.items():
        value = payload
        for part in path.split("."):
            value = value.get(part, missing) if isinstance(value, dict) else missing
        if value is missing or value != expected:
            return False
    return True


def cancel(run_id, reason: str | None = None) -> WorkflowRun:
    """Cancel a run and its unfinished children; return the run.

    A pending or waiting run ends ``cancelled`` at once, its timers cancelled. A running one is
    stopped at its next checkpoint (no later step starts; ``ctx.cancel_requested`` turns True
    for the step in progress). Cancelling again is harmless. Raise WorkflowNotFound for an
    unknown run and RunFinished for one that already ended otherwise.
    """
    pk = _run_pk(run_id)
    db = conf.get("DATABASE")
    error = serialization.dumps_error(Cancelled(reason or "The run was cancelled."))
    with transaction.atomic(using=db):
        run = _cancel(pk, error, db, root=True)
    return run


def _cancel(pk, error: str, db: str, *, root: bool) -> WorkflowRun:
    run = _lock(pk, db)
    if run.status == WorkflowRun.Status.CANCELLED or (run.status in WorkflowRun.TERMINAL and not root):
        return run
    if run.status in WorkflowRun.TERMINAL:
        raise RunFinished(pk, run.status)
    now = clock.db_now()
    items = WorkItem.objects.using(db).filter(run_id=pk, kind=WorkItem.Kind.ADVANCE)
    # A worker holds it: ask, and flag the item so that it comes back to a worker even if
    # the run was about to wait; the worker ends the run at its next checkpoint.
    if items.filter(status=WorkItem.Status.PROCESSING).update(wake=True):
        WorkflowRun.objects.using(db).filter(pk=pk, cancel_requested_at__isnull=True).update(
            cancel_requested_at=now, error=error, updated_at=now
        )
        workpool.notify(db)
    else:
        items.update(status=WorkItem.Status.COMPLETED, wake=False, available_at=now)
        WorkflowRun.objects.using(db).filter(pk=pk).update(
            status=WorkflowRun.Status.CANCELLED, cancel_requested_at=now, error=error, waiting_on="",
            finished_at=now, updated_at=now,
        )
        _cancel_timers(pk, db)
        workflow = run.workflow
        transaction.on_commit(lambda: signals.send(signals.run_cancelled, workflow, run_id=pk), using=db)
    for child in WorkflowRun.objects.using(db).filter(parent_id=pk).unfinished().values_list("pk", flat=True):
        _cancel(child, serialization.dumps_error(Cancelled(f"Its parent run {pk} was cancelled.")), db, root=False)
    run.refresh_from_db()
    return run


def _cancel_timers(pk, db: str) -> None:
    timers = Timer.objects.using(db).filter(run_id=pk, status=Timer.Status.PENDING)
    if connections[db].vendor == "postgresql":
        # A timer being fired holds its lock and waits for the item we hold: skip it, it can
        # only wake a finished run.
        timers = Timer.objects.using(db).filter(
            pk__in=list(timers.select_for_update(skip_locked=True).values_list("pk", flat=True))
        )
    timers.update(status=Timer.Status.CANCELLED)
