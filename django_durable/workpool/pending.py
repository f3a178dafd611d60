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
