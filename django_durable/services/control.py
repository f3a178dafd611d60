"""Operator actions on a run's life: cancel, force fail, retry, retry the rollback, wake, recover, duplicate, fork.

Each takes the run's locks in the workers' order (item, then run), checks the run's state,
changes it in one transaction with an entry in the run's audit trail, and raises a
DurableError subclass when the run's state does not allow it. The admin, the REST API and
the command line call these; `by` names who acted (empty: code).
"""

from __future__ import annotations

import uuid

from django.db import IntegrityError, transaction

from .. import clock, conf, ids, registry, serialization, workpool
from ..workpool import endings, evidence, locking
from ..exceptions import Cancelled, ForcedFailure, InvalidTransition, RunFinished, StepNotFound
from ..models import Step, Timer, WorkflowEvent, WorkflowRun, WorkItem
from ..models.pool import PENDING_UNSEEN
from .locks import lock_run, lock_unfinished
from ..workpool.runs import create_run, set_deadline
from ..ids import run_pk
from .runs import get_run

Status = WorkflowRun.Status
EventType = WorkflowEvent.Type

# The states retry_run() restarts a run from; and those it takes a run from, a held one resumed.
RETRYABLE = frozenset({Status.FAILED, Status.TIMED_OUT, Status.CANCELLED})
RESUMABLE = RETRYABLE | WorkflowRun.HELD


def cancel(run_id, reason: str | None = None, *, by: str | None = None) -> WorkflowRun:
    """Cancel a run and its unfinished children; return the run.

    A pending or waiting run ends ``cancelled`` at once, its timers cancelled. A running one is
    stopped at its next checkpoint, and its step in progress is interrupted (``durable.Cancelled``
    is raised in it) after DURABLE_CANCEL_GRACE_SECONDS unless the step is not cancellable;
    ``ctx.cancel_requested`` turns True for that step meanwhile. Children started detached go
    on. Cancelling again is harmless. Raise WorkflowNotFound for an unknown run and RunFinished
    for one that already ended otherwise.
    """
    pk = run_pk(run_id)
    db = conf.get("DATABASE")
    error = serialization.dumps_error(Cancelled(reason or "The run was cancelled."))
    with transaction.atomic(using=db):
        descendants = locking.lock_descendants(pk, db)
        run = lock_run(pk, db)
        if run.status == Status.CANCELLED:
            return run
        if run.status in WorkflowRun.TERMINAL:
            raise RunFinished(pk, run.status)
        WorkflowEvent.record(pk, EventType.CANCELLED, by=by, message=reason or "", db=db)
        endings.cancel_run(run, error, db, descendants=descendants)
    run.refresh_from_db()
    return run


def force_fail(run_id, reason: str | None = None, *, by: str | None = None) -> WorkflowRun:
    """End an unfinished run ``failed`` now, with no compensation; return it.

    The blunt instrument for a run that must stop whatever it is doing: a worker advancing it
    loses its claim (it writes nothing more and drops the run at its next checkpoint), its
    timers and pending branches are cancelled, and its unfinished children are cancelled.
    Raise WorkflowNotFound, or RunFinished for a run that already ended.
    """
    pk = run_pk(run_id)
    db = conf.get("DATABASE")
    error = serialization.dumps_error(ForcedFailure(reason or "An operator forced the run to fail."))
    with transaction.atomic(using=db):
        descendants = locking.lock_descendants(pk, db)
        run = lock_unfinished(pk, db)
        WorkflowEvent.record(pk, EventType.FORCE_FAILED, by=by, message=reason or "", data={"from": run.status}, db=db)
        endings.end_run(pk, Status.FAILED, db=db, error=error, descendants=descendants,
                        why=f"Its parent run {pk} was forced to fail.")
    run.refresh_from_db()
    return run


def retry_run(run_id, *, by: str | None = None) -> WorkflowRun:
    """Run a failed, timed-out or cancelled run again from its last checkpoint; return it.

    Its completed steps keep their results and never run again; the steps that failed or were
    in progress run again with fresh attempts, and so do its children that failed, timed out
    or were cancelled. The run gets a fresh budget of run attempts and, if its workflow has a
    timeout, a fresh deadline. Raise WorkflowNotFound, or InvalidTransition for a run in
    another state or one whose compensations already ran (start a new run: duplicate()).

    A ``blocked`` run (its code changed under it) is resumed: its next worker replays it
    against the code installed now, where it stopped, with nothing of it reset; if the code
    still differs from its journal it is blocked again. A ``paused`` run (a step's attempts ran
    out under ``RetryPolicy(on_exhausted="pause")``) is resumed the same way, its paused step
    tried again with fresh attempts (its errors so far kept in its entry).
    """
    pk = run_pk(run_id)
    db = conf.get("DATABASE")
    with transaction.atomic(using=db):
        run = lock_run(pk, db)
        if run.status in WorkflowRun.HELD:
            if run.status == Status.PAUSED:
                paused = Step.objects.using(db).filter(run_id=pk, status=Step.Status.PAUSED)
                keys = list(paused.values_list("key", flat=True))
                paused.update(status=Step.Status.RETRYING, attempts=0, retry_at=None)
                workpool.ready_branches(pk, keys, db=db)  # a paused branch's item, held until now
            _give_advance_back(run, db)
            WorkflowEvent.record(pk, EventType.RETRIED, by=by, data={"from": run.status}, db=db)
            run.refresh_from_db()
            return run
        check_restartable(run, db)
        previous = run.status
        try:
            with transaction.atomic(using=db):
                restart(run, db)
        except IntegrityError:  # durable_run_one_at_a_time: another run holds its subject now
            raise InvalidTransition(
                f"Workflow run {pk} cannot go again while another run of {run.workflow} for its subject "
                f"({run.subject_label or run.subject_id}) is unfinished.") from None
        WorkflowEvent.record(pk, EventType.RETRIED, by=by, data={"from": previous}, db=db)
    run.refresh_from_db()
    return run


def check_restartable(run: WorkflowRun, db: str, *, rollback: bool = False) -> None:
    """Raise InvalidTransition unless `run` may go again from its last checkpoint.

    With `rollback`, a ``compensation_failed`` run may (its rollback goes on).
    """
    allowed = RETRYABLE | {Status.COMPENSATION_FAILED} if rollback else RETRYABLE
    if run.status not in allowed:
        raise InvalidTransition(
            f"Workflow run {run.pk} is {run.status}: only a failed, timed-out or cancelled run can be retried."
        )
    if not rollback and Step.objects.using(db).filter(run_id=run.pk, kind=Step.Kind.ROLLBACK).exists():
        raise InvalidTransition(
            f"The compensations of workflow run {run.pk} already ran, so it cannot go on from its last "
            f"checkpoint; start a new run (duplicate it) instead."
        )
    if WorkItem.objects.using(db).filter(
        run_id=run.pk, kind=WorkItem.Kind.STEP, status=WorkItem.Status.PROCESSING
    ).exists():
        raise InvalidTransition(
            f"A worker is still running a branch of workflow run {run.pk}; retry it when that branch ends."
        )


def restart(run: WorkflowRun, db: str) -> None:
    """Put a locked, finished run back in the queue at its last checkpoint (and its failed children).

    What it erases (its error, its failed steps) is first kept in an "attempt ended" audit entry.
    """
    evidence.keep(run.pk, attempt=run.attempt, status=run.status, error=run.error, finished_at=run.finished_at,
                  worker=run.last_worker, db=db)
    # Under either id a child may have (ids.child_id, or the UUIDv5 of builds before 2026-11-25).
    unfinished_children = [
        child
        for key in Step.objects.using(db).filter(run_id=run.pk, kind=Step.Kind.CHILD)
        .exclude(status=Step.Status.COMPLETED).values_list("key", flat=True)
        for child in (ids.child_id(run.pk, key), ids.legacy_child_id(run.pk, key))
    ]
    # What did not complete runs again; a parallel group is made again, and its branches that
    # completed are counted off without running (see run_branch).
    Step.objects.using(db).filter(run_id=run.pk).exclude(status=Step.Status.COMPLETED).delete()
    endings.cancel_branches(run.pk, db)
    endings.cancel_timers(run.pk, db)
    workpool.back_to_pending(
        run.pk, db=db, taken=True, item={"step_key": ""}, from_statuses=RETRYABLE, result=None, error=None,
        finished_at=None, cancel_requested_at=None, attempt=1, deadline_at=None,
    )
    definition = registry.find(run.workflow)
    if definition is not None and definition.timeout is not None:
        set_deadline(run, definition.timeout, db)
    for child_id in unfinished_children:
        child = WorkflowRun.objects.using(db).filter(pk=child_id).values_list("status", flat=True).first()
        if child in RETRYABLE:
            child_run = lock_run(child_id, db)
            check_restartable(child_run, db)
            restart(child_run, db)
    workpool.notify(db)


def retry_rollback(run_id, *, by: str | None = None) -> WorkflowRun:
    """Try the remaining compensations of a ``compensation_failed`` run again; return the run.

    The compensations that failed are forgotten (they run again, with fresh attempts) and the
    run goes back to the queue; the ones that completed are not run again. Raise
    WorkflowNotFound, or InvalidTransition if the run is not ``compensation_failed``.
    """
    pk = run_pk(run_id)
    db = conf.get("DATABASE")
    with transaction.atomic(using=db):
        run = lock_run(pk, db)
        if run.status != Status.COMPENSATION_FAILED:
            raise InvalidTransition(
                f"Workflow run {pk} is {run.status}, not compensation_failed: there is no rollback to retry."
            )
        WorkflowEvent.record(pk, EventType.ROLLBACK_RETRIED, by=by, db=db)
        Step.objects.using(db).filter(run_id=pk, kind=Step.Kind.ROLLBACK, status=Step.Status.FAILED).delete()
        workpool.back_to_pending(pk, db=db, taken=True, item={"step_key": ""},
                                 from_statuses=[Status.COMPENSATION_FAILED], finished_at=None)
        workpool.notify(db)
    run.refresh_from_db()
    return run


# Timers that only make a run wait: firing them early is safe. A wait's timeout and the run's
# deadline end in failure when they fire, so they fire early only when named.
WAKE_KINDS = (Timer.Kind.SLEEP, Timer.Kind.RETRY, Timer.Kind.DELAYED_START)


def wake(run_id, timer_id: int | None = None, *, by: str | None = None) -> int:
    """Fire the run's pending sleeps, back-offs and delayed start now; return how many fired.

    With `timer_id`, fire just that timer, whatever its kind: a wait's timeout then times the
    wait out, the run's deadline times the run out. Raise WorkflowNotFound, RunFinished for a
    finished run, InvalidTransition if there is nothing to fire.
    """
    pk = run_pk(run_id)
    db = conf.get("DATABASE")
    with transaction.atomic(using=db):
        lock_unfinished(pk, db)
        now = clock.db_now()
        timers = Timer.objects.using(db).filter(run_id=pk, status=PENDING_UNSEEN)
        timers = timers.filter(pk=timer_id) if timer_id is not None else timers.filter(kind__in=WAKE_KINDS)
        rows = list(timers.values_list("id", "kind", "step_key"))
        branches = WorkItem.objects.none()
        if timer_id is None:  # branches waiting out a back-off
            branches = WorkItem.objects.using(db).filter(
                run_id=pk, kind=WorkItem.Kind.STEP, status=PENDING_UNSEEN, available_at__gt=now
            )
        fired = len(rows) + branches.update(available_at=now)
        if not fired:
            raise InvalidTransition(f"Workflow run {pk} has no pending timer to fire.")
        steps = Step.objects.using(db).filter(run_id=pk)
        for _, kind, key in rows:
            # The journal keeps the time a wait ends: move it, or the replay would wait again.
            if kind in (Timer.Kind.SLEEP, Timer.Kind.SIGNAL_TIMEOUT) and key:
                steps.filter(key=key, status=Step.Status.WAITING).update(deadline_at=now)
            elif kind == Timer.Kind.RETRY and key:
                steps.filter(key=key, status=Step.Status.RETRYING).update(retry_at=now)
            elif kind == Timer.Kind.DEADLINE:
                WorkflowRun.objects.using(db).filter(pk=pk).update(deadline_at=now)
        Timer.objects.using(db).filter(pk__in=[timer_pk for timer_pk, _, _ in rows]).update(
            status=Timer.Status.FIRED, fire_at=now, fired_at=now
        )
        workpool.wake([pk], db=db)
        WorkflowEvent.record(pk, EventType.WOKEN, by=by, db=db,
                             data={"timers": [f"{kind} {key}".strip() for _, kind, key in rows]})
    return fired


def recover(run_ids=None, *, by: str | None = None) -> list[uuid.UUID]:
    """Give every unfinished run that nothing will advance its advance back; return their ids.

    Those are the admin's stuck runs "nothing will advance it": no work item queued or claimed,
    no pending timer, no wait for a signal or an event, no unfinished child (a database restored
    from a backup, rows edited by hand, a bug). Each gets its advance item back, ready now, and an
    entry in its audit trail; its next worker replays it from the journal. With `run_ids`, only
    those of them. A run whose worker's lease expired needs nothing: the reaper takes it back.
    """
    db = conf.get("DATABASE")
    candidates = WorkflowRun.objects.using(db).stuck(lease_expired=False)
    if run_ids is not None:
        candidates = candidates.filter(pk__in=[run_pk(run_id) for run_id in run_ids])
    recovered = []
    for pk in list(candidates.values_list("pk", flat=True)):
        with transaction.atomic(using=db):
            try:
                run = lock_unfinished(pk, db)
            except RunFinished:
                continue
            if not WorkflowRun.objects.using(db).filter(pk=pk).stuck(lease_expired=False).exists():
                continue  # something advanced it meanwhile
            _give_advance_back(run, db)
            WorkflowEvent.record(pk, EventType.RECOVERED, by=by, db=db,
                                 message="Nothing would advance it; its advance was given back.")
            recovered.append(pk)
    return recovered


def _give_advance_back(run: WorkflowRun, db: str) -> None:
    """Queue the locked, unfinished `run`'s advance, ready now; the run waits for it (pending)."""
    workpool.back_to_pending(run.pk, db=db, item={"step_key": ""}, from_statuses=[Status.RUNNING, *WorkflowRun.HELD])
    workpool.notify(db)


def duplicate(run_id, *, by: str | None = None) -> WorkflowRun:
    """Start a new run of the same workflow with the same input, queue and priority; return it.

    Raise WorkflowNotFound for an unknown run, or one whose workflow is no longer registered.
    """
    source = get_run(run_id)
    definition = registry.get(source.workflow)
    arguments = source.get_input() or {}
    db = conf.get("DATABASE")
    with transaction.atomic(using=db):
        run = create_run(definition, arguments.get("args", []), arguments.get("kwargs", {}), queue=source.queue,
                         priority=source.priority)
        WorkflowEvent.record(run.pk, EventType.DUPLICATED, by=by, message=f"A duplicate of run {source.pk}.",
                             data={"source": str(source.pk)}, db=db)
        WorkflowEvent.record(source.pk, EventType.DUPLICATED, by=by, message=f"Duplicated as run {run.pk}.",
                             data={"duplicate": str(run.pk)}, db=db)
    return run


# What an unfinished entry copied into a fork would be, for the refusal.
_UNFINISHED = {
    Step.Kind.PARALLEL: "a fan-out still running", Step.Kind.CHILD: "a child workflow still running",
    Step.Kind.SIGNAL: "a wait for a signal not over", Step.Kind.EVENT: "a wait for an event not over",
    Step.Kind.APPROVAL: "an approval not decided", Step.Kind.SLEEP: "a sleep not over",
}


def fork(run_id, *, from_step: str, by: str | None = None) -> WorkflowRun:
    """Start a new run of the same workflow and input whose journal is the source run's up to the
    step `from_step` (its key): the entries before it are copied, not run again, and it and
    everything after it run on the code installed now. Return the new run.

    The copied entries keep their results but not the fingerprints of their calls: the new run's
    code may call them otherwise (with its own run id, or arguments a fix changed), and what it
    takes from the copy is the results. The new run names its source (``forked_from``,
    ``forked_at_step``) and both audit trails say so. Refused (InvalidTransition, with the reason) where the copy would not be a journal a run
    could have written: the step is a branch of a fan-out (fork from the fan-out's key), or an
    entry before it is unfinished (a fan-out or a child still running, a wait not over). Raise
    WorkflowNotFound for an unknown run or workflow, StepNotFound for a key not in its journal.
    """
    from ..partitioning.journal import entry_fields

    source = get_run(run_id)
    definition = registry.get(source.workflow)
    if definition.kind == "task":
        raise InvalidTransition(f"Run {source.pk} is a task, which has no journal to fork from: duplicate it instead.")
    db = conf.get("DATABASE")
    entries = list(Step.objects.using(db).filter(run_id=source.pk).order_by("seq"))
    cut = next((entry for entry in entries if entry.key == from_step), None)
    if cut is None:
        keys = [entry.key for entry in entries if entry.kind not in (Step.Kind.LOG, Step.Kind.PROGRESS)]
        shown = ", ".join(map(repr, keys[:20])) + (f" and {len(keys) - 20} more" if len(keys) > 20 else "")
        raise StepNotFound(f"Run {source.pk} has no step {str(from_step)[:100]!r} in its journal"
                           + (f"; its keys are {shown}." if keys else ", which is empty."))
    branches = dict(WorkItem.objects.using(db).filter(run_id=source.pk, kind=WorkItem.Kind.STEP)
                    .values_list("step_key", "group"))
    if cut.key in branches:
        raise InvalidTransition(f"Step {cut.key!r} is a branch of the fan-out {branches[cut.key]!r}: fork from "
                                f"the fan-out ({branches[cut.key]!r}) or a step before it.")
    # The run's progress is one entry kept `running` and rewritten in place: the fork sets its own.
    copied = [entry for entry in entries if entry.seq < cut.seq and entry.kind != Step.Kind.PROGRESS]
    unfinished = [entry for entry in copied if entry.status not in Step.FINAL]
    if unfinished:
        first = unfinished[0]
        raise InvalidTransition(
            f"Run {source.pk} cannot be forked from {cut.key!r}: {_UNFINISHED.get(first.kind, 'a step not finished')} "
            f"comes before it ({first.key!r}, {first.status}). Fork from it or an earlier step, or once it is over.")
    arguments = source.get_input() or {}
    with transaction.atomic(using=db):
        run = create_run(definition, arguments.get("args", []), arguments.get("kwargs", {}), queue=source.queue,
                         priority=source.priority, concurrency_key=source.concurrency_key or None,
                         subject=source.subject)
        WorkflowRun.objects.using(db).filter(pk=run.pk).update(forked_from=source.pk, forked_at_step=cut.key)
        run.forked_from, run.forked_at_step = source.pk, cut.key
        fields = entry_fields(run.pk, db)
        Step.objects.using(db).bulk_create([
            Step(run_id=run.pk, key=entry.key, seq=entry.seq, kind=entry.kind, name=entry.name, status=entry.status,
                 result=_owned(entry.result, run.pk), error=_owned(entry.error, run.pk), attempts=entry.attempts,
                 started_at=entry.started_at, finished_at=entry.finished_at, deadline_at=entry.deadline_at,
                 match=entry.match, remaining=entry.remaining, fingerprint=None, **fields)
            for entry in copied
        ])
        WorkflowEvent.record(run.pk, EventType.FORKED, by=by, data={"source": str(source.pk), "step": cut.key},
                             message=f"Forked from run {source.pk} at step {cut.key!r}: {len(copied)} journal "
                                     f"entries copied, the rest runs on the code installed now.", db=db)
        WorkflowEvent.record(source.pk, EventType.FORKED, by=by, data={"fork": str(run.pk), "step": cut.key},
                             message=f"Forked at step {cut.key!r} as run {run.pk}.", db=db)
    return run


def _owned(text: str | None, run_id) -> str | None:
    """A journal value for the run `run_id`: one stored apart (payloads.py) is stored again, as the
    new run's, so that pruning the source does not take it from the fork."""
    from .. import payloads

    if text is None or not text.startswith(payloads.PREFIX):
        return text
    return serialization.encode(serialization.decode(text), owner=run_id)


def release_claim(item_id: int, *, by: str | None = None) -> bool:
    """Return a claimed work item to the queue now, taking it from its worker; return whether it was claimed.

    For a claim whose worker hangs but keeps renewing its lease. The worker writes nothing
    more for it (its writes are fenced by the claim); the step it was running may run again.
    """
    db = conf.get("DATABASE")
    with transaction.atomic(using=db):
        item = WorkItem.objects.using(db).filter(pk=item_id).values_list("run_id", "claimed_by", "kind").first()
        if item is None:
            return False
        run_id, claimed_by, kind = item
        why = f"Claim of {claimed_by} released by {by or 'code'}."[:2000]
        if kind == WorkItem.Kind.ADVANCE:
            released = workpool.back_to_pending(run_id, db=db, held_only=True, item={"last_error": why})
        else:
            released = WorkItem.objects.using(db).filter(pk=item_id, status=WorkItem.Status.PROCESSING).requeue(
                last_error=why)
        if released and run_id is not None:
            WorkflowEvent.record(run_id, EventType.CLAIM_RELEASED, by=by, message=f"Taken from worker {claimed_by}.",
                                 data={"item": item_id, "kind": kind}, db=db)
        if released:
            workpool.notify(db)
    return bool(released)
