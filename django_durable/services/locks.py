"""Locking a run from outside the workers, in the order the workers use."""

from __future__ import annotations

from ..exceptions import RunFinished, WorkflowNotFound
from ..models import WorkflowRun
from ..workpool import locking


def lock_run(pk, db: str) -> WorkflowRun:
    """Lock the run's work item, then the run (the workers' order); return the run or raise WorkflowNotFound."""
    run = locking.lock_run(pk, db)
    if run is None:
        raise WorkflowNotFound(f"No workflow run has the id {str(pk)!r}.")
    return run


def lock_unfinished(pk, db: str) -> WorkflowRun:
    """lock_run(), and raise RunFinished if the run already ended."""
    run = lock_run(pk, db)
    if run.status in WorkflowRun.TERMINAL:
        raise RunFinished(pk, run.status)
    return run
