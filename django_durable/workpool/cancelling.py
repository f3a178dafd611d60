"""Cancelling runs that no claim of the caller covers: a cancel request, and a parent's children.

A run that ends other than ``completed`` takes its unfinished children with it, in the
transaction that ends it, recursively (children started ``detached`` excepted). The operator
services (cancel, force fail), the worker finishing a run and the reaper failing a poison run
all call these.

Lock order: a worker finishing a child locks the child's work item and then its parent's (to
wake it), so whoever cancels a tree locks the descendants first, deepest first, and the run
at its top last; taking them the other way round could deadlock with that worker.
"""

from __future__ import annotations

import uuid

from django.db import connections, transaction

from .. import clock, registry, serialization, signals
from ..exceptions import Cancelled
from ..models import Timer, WorkflowRun, WorkItem

Status = WorkflowRun.Status


def lock_run(pk, db: str) -> WorkflowRun | None:
    """Lock the run's work item, then the run; return the run (None if there is none).

    The order the workers use: a claim locks the item (skipping locked ones) and then updates
    the run; taking them the other way round could deadlock with it.
    """
    list(
        WorkItem.objects.using(db).filter(run_id=pk, kind=WorkItem.Kind.ADVANCE)
        .select_for_update(no_key=True).values_list("id", flat=True)
    )
    return WorkflowRun.objects.using(db).select_for_update(no_key=True).filter(pk=pk).first()


def descendants(pk, db: str) -> list[uuid.UUID]:
    """The unfinished, attached descendants of run `pk`, deepest generation first."""
    generations, parents = [], [pk]
    seen = {pk}
    while parents:
        children = [
            child for child in WorkflowRun.objects.using(db)
            .filter(parent_id__in=parents, detached=False).unfinished().values_list("pk", flat=True)
            if child not in seen
        ]
        seen.update(children)
        generations.append(children)
        parents = children
    return [child for generation in reversed(generations) for child in generation]


def lock_descendants(pk, db: str) -> list[WorkflowRun]:
    """Lock the unfinished, attached descendants of run `pk`, deepest first; return them.

    Call before locking `pk` itself (see the lock order above), in the transaction that will
    end or cancel it, and hand the result to cancel_descendants().
    """
    return [run for run in (lock_run(child, db) for child in descendants(pk, db)) if run is not None]


def cancel_descendants(runs: list[WorkflowRun], *, why: str, db: str) -> int:
    """Cancel the locked descendants that lock_descendants() returned; return how many.

    Each is cancelled as durable.cancel() would: at once if no worker holds it, else at its
    worker's next checkpoint (its step is interrupted after DURABLE_CANCEL_GRACE_SECONDS).
    """
    error = serialization.dumps_error(Cancelled(why))
    unfinished = [run for run in runs if run.status not in WorkflowRun.TERMINAL]  # locked: it stays so
    for run in unfinished:
        cancel_run(run, error, db)
    return len(unfinished)


def cancel_run(run: WorkflowRun, error: str, db: str, *, wake_parent: bool = False) -> bool:
    """Cancel one locked, unfinished run (not its children); return True if it ended now.

    A run no worker holds ends ``cancelled`` at once, its timers and pending branches
    cancelled. A run a worker holds (or one that compensates on cancel) is asked to stop:
    its item is flagged so that it comes back to a worker even if it was about to wait, and
    the worker ends it at its next checkpoint.
    """
    from . import notify, wake

    now = clock.db_now()
    items = WorkItem.objects.using(db).filter(run_id=run.pk, kind=WorkItem.Kind.ADVANCE)
    cancel_branches(run.pk, db)
    definition = registry.find(run.workflow)
    if definition is not None and definition.compensate_on_cancel:
        requested = wake(run.pk, db=db)  # its compensations run first, in a worker
    else:
        requested = items.filter(status=WorkItem.Status.PROCESSING).update(wake=True)
    if requested:
        WorkflowRun.objects.using(db).filter(pk=run.pk, cancel_requested_at__isnull=True).update(
            cancel_requested_at=now, error=error, updated_at=now
        )
        notify(db)
        return False
    items.update(status=WorkItem.Status.COMPLETED, wake=False, available_at=now)
    end_run(run, Status.CANCELLED, error, db, wake_parent=wake_parent, cancel_requested_at=now)
    return True


def end_run(run: WorkflowRun, status: str, error: str, db: str, *, wake_parent: bool, **fields) -> None:
    """End a run that no worker holds: its timers cancelled, its parent woken, its waits told,
    the signal sent."""
    from . import announce_end, wake

    now = clock.db_now()
    WorkflowRun.objects.using(db).filter(pk=run.pk).update(
        status=status, error=error, waiting_on="", finished_at=now, updated_at=now, **fields
    )
    announce_end([run.pk], db=db)
    cancel_timers(run.pk, db)
    if run.parent_id is not None and wake_parent:
        wake([run.parent_id], db=db)  # it may be waiting for this child
    workflow, pk = run.workflow, run.pk
    if status == Status.CANCELLED:
        transaction.on_commit(lambda: signals.send(signals.run_cancelled, workflow, run_id=pk), using=db)
    else:
        decoded = serialization.decode(error)
        transaction.on_commit(
            lambda: signals.send(signals.run_failed, workflow, run_id=pk, status=status, error=decoded), using=db
        )


def cancel_branches(pk, db: str) -> None:
    """The run's parallel branches not started yet never start."""
    WorkItem.objects.using(db).filter(run_id=pk, kind=WorkItem.Kind.STEP, status=WorkItem.Status.PENDING).update(
        status=WorkItem.Status.CANCELLED
    )


def cancel_timers(pk, db: str) -> None:
    timers = Timer.objects.using(db).filter(run_id=pk, status=Timer.Status.PENDING)
    if connections[db].vendor == "postgresql":
        # A timer being fired holds its lock and waits for the item we hold: skip it, it can
        # only wake a finished run.
        timers = Timer.objects.using(db).filter(
            pk__in=list(timers.select_for_update(skip_locked=True).values_list("pk", flat=True))
        )
    timers.update(status=Timer.Status.CANCELLED)
