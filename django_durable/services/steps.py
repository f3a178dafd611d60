"""Operator repairs of a run's journal: skip a step, edit a step's recorded result."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import F, Max

from .. import clock, conf, partitioning, serialization, workpool
from ..exceptions import InvalidTransition, RunFinished, StepNotFound
from ..models import Step, Timer, WorkflowEvent, WorkflowRun, WorkItem
from .control import check_restartable, restart
from .locks import lock_run
from ..ids import run_pk

Status = WorkflowRun.Status
AUDIT_CHARS = 4000  # how much of an old or new value the audit trail keeps


def skip_step(run_id, key: str, result: Any = None, *, by: str | None = None) -> WorkflowRun:
    """Record `result` as the outcome of step `key` of a run and let the run go on from there.

    For a step that keeps failing, waits to be retried, waits for a signal, event, sleep or
    child that will not come, or hangs in its worker: the step's function is not called
    again, and the workflow receives `result` where it called the step. A run that ended
    failed, timed out or cancelled goes back to the queue from its last checkpoint, as with
    retry_run(); a ``compensation_failed`` run does when the skipped step is a compensation.
    A worker advancing the run loses its claim (it drops its work at its next checkpoint). A
    key the run has not reached yet is recorded in advance, as a step.

    Raise WorkflowNotFound, RunFinished for a completed run, InvalidTransition for a step
    that completed, a parallel group (skip its branches), a branch a worker is running, or a
    run whose compensations ran; NotSerializable or PayloadTooLarge for `result`.
    """
    _check_key(key)
    text = serialization.encode(result, what="step result", max_bytes=conf.get("MAX_PAYLOAD_BYTES"))
    pk = run_pk(run_id)
    db = conf.get("DATABASE")
    with transaction.atomic(using=db):
        run = lock_run(pk, db)
        if run.status == Status.COMPLETED:
            raise RunFinished(pk, run.status)
        entry = Step.objects.using(db).filter(run_id=pk, key=key).first()
        if entry is not None:
            if entry.status == Step.Status.COMPLETED:
                raise InvalidTransition(f"Step {key!r} of run {pk} already completed; edit its result instead.")
            if entry.kind == Step.Kind.PARALLEL:
                raise InvalidTransition(f"{key!r} of run {pk} is a parallel group: skip its branches instead.")
            if entry.kind == Step.Kind.SLEEP:
                text = "null"  # a sleep returns nothing
        finished = run.status in WorkflowRun.TERMINAL
        if finished:
            check_restartable(run, db, rollback=entry is not None and entry.kind == Step.Kind.ROLLBACK)
        branch = _branch(pk, key, db)
        if branch is not None and not finished:
            if branch.status == WorkItem.Status.PROCESSING:
                raise InvalidTransition(
                    f"A worker is running branch {key!r} of run {pk} now; release its claim on the work "
                    f"items page first, or wait for its attempt to end."
                )
            if branch.status != WorkItem.Status.PENDING:
                raise InvalidTransition(
                    f"Branch {key!r} of run {pk} has ended; skip it once its run has failed."
                )
        now = clock.db_now()
        WorkflowEvent.record(pk, WorkflowEvent.Type.STEP_SKIPPED, by=by, message=f"Step {key!r}", db=db, data={
            "key": key, "result": serialization.display_text(text)[:AUDIT_CHARS],  # as people read it
            "previous": None if entry is None else {"status": entry.status, "error": _error_summary(entry.error)},
        })
        if entry is None:
            seq = (Step.objects.using(db).filter(run_id=pk).aggregate(m=Max("seq"))["m"] or 0) + 1
            Step.objects.using(db).create(run_id=pk, key=key, seq=seq, kind=Step.Kind.STEP, status=Step.Status.COMPLETED,
                                          result=text, attempts=0, started_at=now, finished_at=now,
                                          **partitioning.entry_fields(pk, db))
        else:
            # By (run, key), the journal's index: a partitioned journal has none on the id.
            Step.objects.using(db).filter(run_id=pk, key=key).update(
                status=Step.Status.COMPLETED, result=text, error=None, finished_at=now, retry_at=None
            )
        Timer.objects.using(db).filter(run_id=pk, step_key=key, status=Timer.Status.PENDING).update(
            status=Timer.Status.CANCELLED
        )
        if finished:
            restart(run, db)
        elif branch is not None:
            # Counted off its group like a branch that completed; the last one wakes the run.
            WorkItem.objects.using(db).filter(pk=branch.pk).update(status=WorkItem.Status.COMPLETED)
            group = Step.objects.using(db).filter(run_id=pk, key=branch.group)
            group.update(remaining=F("remaining") - 1)
            if group.filter(remaining__lte=0).exists():
                workpool.wake([pk], db=db)
        else:
            # Taken from a worker that may be stuck in the step; the next one replays past it.
            workpool.back_to_pending(pk, db=db, item={"wake": False})
            workpool.notify(db)
    run.refresh_from_db()
    return run


def edit_step_result(run_id, key: str, result: Any, *, by: str | None = None) -> Step:
    """Replace the recorded result of a completed step; the run's later replays see `result`.

    Steps that already used the old value are not run again. Raise WorkflowNotFound,
    StepNotFound, InvalidTransition for a step that did not complete (skip it instead), a
    sleep or parallel group (they have no result), or a run a worker is advancing right now;
    NotSerializable or PayloadTooLarge for `result`.
    """
    _check_key(key)
    text = serialization.encode(result, what="step result", max_bytes=conf.get("MAX_PAYLOAD_BYTES"))
    pk = run_pk(run_id)
    db = conf.get("DATABASE")
    with transaction.atomic(using=db):
        lock_run(pk, db)
        entry = Step.objects.using(db).filter(run_id=pk, key=key).first()
        if entry is None:
            raise StepNotFound(f"Workflow run {pk} has no step {key!r}.")
        if entry.status != Step.Status.COMPLETED:
            raise InvalidTransition(f"Step {key!r} of run {pk} is {entry.status}: skip it to give it a result.")
        if entry.kind in (Step.Kind.SLEEP, Step.Kind.PARALLEL):
            raise InvalidTransition(f"{key!r} of run {pk} is a {entry.get_kind_display().lower()}; it has no result.")
        if WorkItem.objects.using(db).filter(
            run_id=pk, kind=WorkItem.Kind.ADVANCE, status=WorkItem.Status.PROCESSING
        ).exists():
            raise InvalidTransition(
                f"A worker is advancing run {pk} now; edit the step when the run waits or has ended."
            )
        WorkflowEvent.record(pk, WorkflowEvent.Type.STEP_EDITED, by=by, message=f"Step {key!r}", db=db, data={
            "key": key, "old": serialization.display_text(entry.result)[:AUDIT_CHARS],
            "new": serialization.display_text(text)[:AUDIT_CHARS],
        })
        Step.objects.using(db).filter(run_id=pk, key=key).update(result=text)
        entry.result = text
    return entry


def _branch(pk, key: str, db: str) -> WorkItem | None:
    return (
        WorkItem.objects.using(db).filter(run_id=pk, kind=WorkItem.Kind.STEP, step_key=key)
        .only("pk", "status", "group").order_by("-pk").first()
    )


def _check_key(key) -> None:
    if not isinstance(key, str) or not 0 < len(key) <= 255:
        raise ValueError(f"A step key must be a string of 1 to 255 characters, not {str(key)[:80]!r}.")


def _error_summary(error: str | None) -> str:
    parts = serialization.error_parts(error, limit=500)
    return f"{parts['type']}: {parts['message']}"[:500] if parts else ""
