"""Cancelling runs and retrying their rollback: operator actions on a run's life."""

from __future__ import annotations

from django.db import connections, transaction
from django.db.models import Case, F, Value, When

from .. import clock, conf, registry, serialization, signals, workpool
from ..exceptions import Cancelled, InvalidTransition, RunFinished
from ..models import Timer, WorkflowRun, WorkItem
from .locks import lock_run
from .runs import _run_pk


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
    run = lock_run(pk, db)
    if run.status == WorkflowRun.Status.CANCELLED or (run.status in WorkflowRun.TERMINAL and not root):
        return run
    if run.status in WorkflowRun.TERMINAL:
        raise RunFinished(pk, run.status)
    now = clock.db_now()
    items = WorkItem.objects.using(db).filter(run_id=pk, kind=WorkItem.Kind.ADVANCE)
    # Its branches not started yet never start.
    WorkItem.objects.using(db).filter(run_id=pk, kind=WorkItem.Kind.STEP, status=WorkItem.Status.PENDING).update(
        status=WorkItem.Status.CANCELLED
    )
    definition = registry.find(run.workflow)
    if definition is not None and definition.compensate_on_cancel:
        # Its compensations must run first: a worker does that, then ends the run cancelled.
        requested = items.update(
            wake=True, status=Case(When(status=WorkItem.Status.COMPLETED, then=Value(WorkItem.Status.PENDING)),
                                   default=F("status")),
            available_at=Case(When(status=WorkItem.Status.COMPLETED, then=now), default=F("available_at")),
        )
    else:
        # A worker holds it: ask, and flag the item so that it comes back to a worker even if
        # the run was about to wait; the worker ends the run at its next checkpoint.
        requested = items.filter(status=WorkItem.Status.PROCESSING).update(wake=True)
    if requested:
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
        if run.parent_id is not None and root:
            workpool.wake([run.parent_id], db=db)  # it may be waiting for this child
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


def retry_rollback(run_id) -> WorkflowRun:
    """Try the remaining compensations of a ``compensation_failed`` run again; return the run.

    The compensations that failed are forgotten (they run again, with fresh attempts) and the
    run goes back to the queue; the ones that completed are not run again. Raise
    WorkflowNotFound, or InvalidTransition if the run is not ``compensation_failed``.
    """
    pk = _run_pk(run_id)
    db = conf.get("DATABASE")
    with transaction.atomic(using=db):
        run = lock_run(pk, db)
        if run.status != WorkflowRun.Status.COMPENSATION_FAILED:
            raise InvalidTransition(
                f"Workflow run {pk} is {run.status}, not compensation_failed: there is no rollback to retry."
            )
        from ..models import Step

        Step.objects.using(db).filter(run_id=pk, kind=Step.Kind.ROLLBACK, status=Step.Status.FAILED).delete()
        now = clock.db_now()
        WorkflowRun.objects.using(db).filter(pk=pk).update(
            status=WorkflowRun.Status.PENDING, finished_at=None, waiting_on="", updated_at=now
        )
        WorkItem.objects.using(db).filter(run_id=pk, kind=WorkItem.Kind.ADVANCE).update(
            status=WorkItem.Status.PENDING, available_at=now, attempts=0, wake=False
        )
        workpool.notify(db)
    run.refresh_from_db()
    return run
