"""A run's end: the one place a run becomes terminal, with everything its end drags along.

A run ends in one of two ways, and both do the same:

- its worker finishes it, fenced by its claim (claims.finish_run): on PostgreSQL in one
  statement, queries.FINISH_RUN, the SQL twin of record_end() below; on SQLite by record_end()
  itself, in the transaction whose fence held;
- something outside any claim ends it (end_run()): a cancel, a forced failure, the reaper's
  verdict on a run its workers died on too often.

Either way, in the transaction that ends it, the run gets its terminal status, its finish time
and its error (or result); its advance item is deleted (nothing will advance it again; a retry
makes a new one), by the worker's fence or by end_run(), which keeps only an item the reaper
failed for good (``failed``, with the reason); its timers and its branches not started yet are
cancelled; its parent's advance is woken (the parent may be waiting for this child); a
durable.wait() that marked it is told (NOTIFY, on PostgreSQL); and an end other than
``completed`` cancels its unfinished children, detached ones excepted (cascade()). Once that has
committed, the end's run's definition is told (a django.tasks task's sends task_finished) and its
Django signal is sent, once (announce(): run_completed, run_failed or run_cancelled).
"""

from __future__ import annotations

from typing import NamedTuple

from django.db import transaction

from .. import clock, conf, registry, serialization, signals
from ..exceptions import Cancelled
from ..models import Timer, WorkflowRun, WorkItem
from ..models.pool import PENDING_UNSEEN
from .wakeups import announce_end, notify, wake

Status = WorkflowRun.Status

# What a worker's finish answers for a run that had ended before it: only its item was freed.
UNCHANGED = "unchanged"


class Ended(NamedTuple):
    """A run that has just ended: what its cascade and its signal need to know."""

    run_id: object
    workflow: str
    status: str
    result: str | None = None  # JSON text, for a completed run
    error: str | None = None  # JSON text, for a run that failed or timed out


def record_end(run_id, status: str, *, db: str, result: str | None = None, error: str | None = None,
               cancel_wins: bool = False, wake_parent: bool = True, **fields) -> Ended | None:
    """End run `run_id` with `status` unless it has ended already; return how it ended, or None.

    The ORM twin of queries.FINISH_RUN, change for change. With `cancel_wins` (a worker's
    finish), a cancel requested before this end wins: the run ends cancelled, its cancel's error
    kept. `wake_parent=False` leaves the parent's advance alone: a cascade ends children whose
    parent is ending in the same transaction. Call it in the transaction that holds the run's
    work item (a claim's fence, or locking.lock_run()); it neither cascades nor announces.
    """
    runs = WorkflowRun.objects.using(db).filter(pk=run_id).unfinished()
    row = runs.values("workflow", "parent_id", "cancel_requested_at", "error").first()
    if row is None:
        return None
    if cancel_wins and row["cancel_requested_at"] is not None:
        status, result, error = Status.CANCELLED, None, row["error"]
    runs.end(status, result=result, error=error, **fields)
    cancel_branches(run_id, db)
    if wake_parent and row["parent_id"] is not None:
        wake([row["parent_id"]], db=db)
    cancel_timers(run_id, db)
    announce_end([run_id], db=db)
    return Ended(run_id, row["workflow"], status, result, error)


def end_run(run_id, status: str, *, db: str, error: str | None = None, result: str | None = None,
            descendants: list[WorkflowRun] = (), why: str | None = None, wake_parent: bool = True,
            **fields) -> Ended | None:
    """End a run no worker holds: its advance item deleted (drop_advance), record_end(), the
    cascade to its `descendants` (locked first, by locking.lock_descendants; `why` is their
    error) unless it completed, and its signal once the caller's transaction commits. Return how
    it ended, or None if it had ended already."""
    drop_advance(run_id, db)
    ended = record_end(run_id, status, db=db, result=result, error=error, wake_parent=wake_parent, **fields)
    if ended is not None:
        cascade(ended.run_id, ended.status, descendants, db=db, why=why)
        announce(ended, db=db)
    return ended


def cascade(run_id, status: str, descendants: list[WorkflowRun], *, db: str, why: str | None = None) -> int:
    """An end other than completed (`status`) of run `run_id` cancels its unfinished, attached
    `descendants` (locked by locking.lock_descendants, deepest first), each as durable.cancel()
    would, with `why` as their error; return how many."""
    if status == Status.COMPLETED or not descendants:
        return 0
    error = serialization.dumps_error(Cancelled(why or f"Its parent run {run_id} ended {status}."))
    unfinished = [run for run in descendants if run.status not in WorkflowRun.TERMINAL]  # locked: it stays so
    for run in unfinished:
        # Not waking the parent: it is ending, in this transaction.
        cancel_run(run, error, db, wake_parent=False)
    return len(unfinished)


def cancel_run(run: WorkflowRun, error: str, db: str, *, descendants: list[WorkflowRun] = (),
               wake_parent: bool = True) -> bool:
    """Cancel one locked, unfinished run and its locked `descendants`; return True if it ended now.

    A run no worker holds ends ``cancelled`` at once (end_run()). A run a worker holds (or one
    that compensates on cancel) is asked to stop: its item is flagged so that it comes back to a
    worker even if it was about to wait, and the worker ends it at its next checkpoint. Its
    descendants are cancelled now either way.
    """
    now = clock.db_now()
    why = f"Its parent run {run.pk} was cancelled."
    items = WorkItem.objects.using(db).filter(run_id=run.pk, kind=WorkItem.Kind.ADVANCE)
    definition = registry.find(run.workflow)
    if definition is not None and definition.compensate_on_cancel:
        requested = wake(run.pk, db=db)  # its compensations run first, in a worker
    else:
        requested = items.filter(status=WorkItem.Status.PROCESSING).update(wake=True)
    if requested:
        cancel_branches(run.pk, db)
        WorkflowRun.objects.using(db).filter(pk=run.pk, cancel_requested_at__isnull=True).update(
            cancel_requested_at=now, error=error, updated_at=now
        )
        cascade(run.pk, Status.CANCELLED, descendants, db=db, why=why)
        notify(db)
        return False
    end_run(run.pk, Status.CANCELLED, db=db, error=error, descendants=descendants, why=why, wake_parent=wake_parent,
            cancel_requested_at=now)
    return True


def announce(ended: Ended, *, db: str) -> None:
    """Send the end's signal when the transaction that ended the run commits."""
    transaction.on_commit(lambda: send_end(ended), using=db)


def send_end(ended: Ended) -> None:
    """Tell the run's definition of its end and send the end's signal, now: its transaction has
    committed (a worker's own finish)."""
    workflow, pk = ended.workflow, ended.run_id
    if (definition := registry.find(workflow)) is not None:
        definition.ended(pk, ended.status, ended.result, ended.error)
    if ended.status == Status.COMPLETED:
        # Decoded only for receivers (a result stored apart would be read back otherwise).
        if signals.listened(signals.run_completed, workflow):
            signals.send(signals.run_completed, workflow, run_id=pk, result=serialization.decode(ended.result))
    elif ended.status == Status.CANCELLED:
        signals.send(signals.run_cancelled, workflow, run_id=pk)
    else:
        signals.send(signals.run_failed, workflow, run_id=pk, status=ended.status,
                     error=serialization.decode(ended.error))


def drop_advance(pk, db: str) -> int:
    """Delete the advance item of run `pk`, which is ending: nothing will advance it again, and
    whoever holds it is fenced out (a worker's own end deletes it with its fence instead:
    queries.END_FENCE_DROP). An item the reaper failed for good stays, the evidence of the lost
    deliveries (claims.ended_by_itself reads it). Return how many were deleted."""
    return (WorkItem.objects.using(db).filter(run_id=pk, kind=WorkItem.Kind.ADVANCE)
            .exclude(status=WorkItem.Status.FAILED).drop())


def cancel_branches(pk, db: str, group: str | None = None) -> None:
    """The run's parallel branches not started yet (of parallel group `group`, if given) never
    start (in SQL: queries.UNNEEDED)."""
    branches = WorkItem.objects.using(db).filter(run_id=pk, kind=WorkItem.Kind.STEP, status=PENDING_UNSEEN)
    if group is not None:
        branches = branches.filter(group=group)
    branches.update(status=WorkItem.Status.CANCELLED)


def cancel_timers(pk, db: str) -> None:
    """The run's pending timers never fire (in SQL: queries.QUIET)."""
    timers = Timer.objects.using(db).filter(run_id=pk, status=PENDING_UNSEEN)
    if conf.is_postgres(db):
        # A timer being fired holds its lock and waits for the item we hold: skip it, it can
        # only wake a finished run.
        timers = Timer.objects.using(db).filter(
            pk__in=list(timers.select_for_update(skip_locked=True).values_list("pk", flat=True))
        )
    timers.update(status=Timer.Status.CANCELLED)
