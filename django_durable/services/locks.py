"""Locking a run from outside the workers, in the order the workers use."""

from __future__ import annotations

from ..exceptions import RunFinished, WorkflowNotFound
from ..models import WorkflowRun, WorkItem


def lock_run(pk, db: str) -> WorkflowRun:
    """Lock the run's work item, then the run; return the run or raise WorkflowNotFound.

    The order the workers use: a claim locks the item (skipping locked ones) and then updates
    the run; taking them the other way round here could deadlock with it.
    """
    list(
        WorkItem.objects.using(db).filter(run_id=pk, kind=WorkItem.Kind.ADVANCE)
        .select_for_update(no_key=True).values_list("id", flat=True)
    )
    run = WorkflowRun.objects.using(db).select_for_update(no_key=True).filter(pk=pk).first()
    if run is None:
        raise WorkflowNotFound(f"No workflow run has the id {str(pk)!r}.")
    return run




def lock_unfinished(pk, db: str) -> WorkflowRun:
    """lock_run(), and raise RunFinished if the run already ended."""
    run = lock_run(pk, db)
    if run.status in WorkflowRun.TERMINAL:
        raise RunFinished(pk, run.status)
    return run
