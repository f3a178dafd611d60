"""A run back to pending: the run waits for its next advance and its advance item is ready, together.

The one place the two are paired for the operator services (a restart, a retried rollback, a
resumed run, a step skipped, a claim released): the run's side is WorkflowRunQuerySet.back_to_pending,
the item's WorkItemQuerySet.requeue or, taken from whoever holds it, .end (models). The workers'
own hand-backs (a claim given back, code a worker lacks, the reaper) pair them in the same
transaction as their fence, in claims.py and reaping.py.
"""

from __future__ import annotations

from ..models import WorkflowRun, WorkItem
from .runs import advance_item


def back_to_pending(run_id, *, db: str, from_statuses=None, waiting_on: str = "", taken: bool = False,
                    held_only: bool = False, item: dict | None = None, **fields) -> int:
    """Make run `run_id`'s advance item ready now and the run ``pending``; return how many items changed.

    The item is requeued as it stands (its delivery count kept), or with `taken` ended afresh, its
    claim dropped whoever holds it and its count reset; with `held_only` only an item a worker holds
    is (a claim released), and the run moves only if it was. `item` are fields of the item set with
    it (its last error, a step forgotten); a missing advance item (deleted by hand) is made again.
    `from_statuses`, `waiting_on` and `fields` go to the run's side (WorkflowRunQuerySet.back_to_pending).
    Call it in the transaction that holds the run's lock; it does not notify the workers.
    """
    items = WorkItem.objects.using(db).filter(run_id=run_id, kind=WorkItem.Kind.ADVANCE)
    if held_only:
        items = items.filter(status=WorkItem.Status.PROCESSING)
    changed = items.end(WorkItem.Status.PENDING, **(item or {})) if taken else items.requeue(**(item or {}))
    if not changed and held_only:
        return 0
    if not changed:
        advance_item(WorkflowRun.objects.using(db).get(pk=run_id)).save(using=db, force_insert=True)
    WorkflowRun.objects.using(db).filter(pk=run_id).back_to_pending(from_statuses=from_statuses,
                                                                    waiting_on=waiting_on, **fields)
    return changed


def hold_paused(run_id, waiting_on: str, *, db: str, key: str, attempts: int) -> bool:
    """A branch of the run ran out of attempts under a policy that pauses: hold the run ``paused``
    for an operator (unless it ended or is being cancelled meanwhile), with an audit entry. Return
    whether it was held. The branch's own write (its entry paused, its item held) came first."""
    from django.db import transaction

    from .. import clock
    from ..models import WorkflowEvent

    with transaction.atomic(using=db):
        held = (WorkflowRun.objects.using(db).filter(pk=run_id, cancel_requested_at__isnull=True).unfinished()
                .update(status=WorkflowRun.Status.PAUSED, waiting_on=waiting_on[:500], updated_at=clock.db_now()))
        if held:
            WorkflowEvent.record(run_id, WorkflowEvent.Type.PAUSED, by=None, message=waiting_on,
                                 data={"step": key, "attempts": attempts}, db=db)
    return bool(held)


def ready_branches(run_id, keys, *, db: str) -> int:
    """Make the held items of these branches of the run (paused ones, resumed) ready now; return how many."""
    from .. import clock

    return (WorkItem.objects.using(db).filter(run_id=run_id, kind=WorkItem.Kind.STEP, step_key__in=list(keys),
                                              status=WorkItem.Status.PENDING)
            .update(available_at=clock.db_now()))
