"""Locking a run and its descendants from outside a claim, in the order the workers lock them.

A worker finishing a child locks the child's work item and then its parent's (to wake it), so
whoever ends or cancels a tree locks the descendants first, deepest first, and the run at its
top last; taking them the other way round could deadlock with that worker. A claim locks the
item (skipping locked ones) and then updates the run, so a run is locked item first too.
"""

from __future__ import annotations

import uuid

from ..models import WorkflowRun, WorkItem


def lock_run(pk, db: str) -> WorkflowRun | None:
    """Lock the run's advance item (an ended run has none), then the run; return the run (None if
    there is none)."""
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
    end or cancel it, and hand the result to the ending (endings.end_run, or cascade()).
    """
    return [run for run in (lock_run(child, db) for child in descendants(pk, db)) if run is not None]
