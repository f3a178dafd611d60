"""Advancing a run: replay the workflow function against its journal, then record the outcome."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable

from django.db import DatabaseError

from .. import clock, conf, faults, registry, serialization, workpool
from ..exceptions import StepFailed, WorkflowNotFound
from ..interrupts import DatabaseUnavailable, LeaseLost, Preempted, Suspend
from ..models import WorkflowRun
from .context import Context, Entry

logger = logging.getLogger("django_durable.worker")

RunStatus = WorkflowRun.Status


class Session:
    """Binds a Context to the claim under which its run advances, and buffers its journal writes.

    A step's checkpoint is written just before the next step starts (or with the run's outcome
    or suspension), never later: no step's side effects begin before every earlier step is
    durably recorded. Between the two only deterministic workflow code runs, so a crash in
    that gap is the same as a crash just before the checkpoint. It saves the last step's
    commit and lets recorded values ride along with the next checkpoint.
    """

    def __init__(self, claim: workpool.Claim, should_stop: Callable[[], bool]):
        self.claim = claim
        self.db = claim.db
        self._should_stop = should_stop
        self.pending: list[workpool.StepRecord] = []

    def before_step(self) -> None:
        """Make the journal durable; raise LeaseLost if the claim may be gone, Preempted if stopping.

        The lease is checked against the local monotonic clock, so no new step starts without
        a live lease and the check costs no round trip; the flush's fenced write confirms it.
        """
        self.flush()
        # After the flush: a pause (GC, SIGSTOP) between that write and this check must not
        # let a worker whose lease lapsed meanwhile start the step.
        if not self.claim.alive():
            raise LeaseLost("lease expired")
        if self._should_stop():
            raise Preempted()

    def now(self):
        return clock.now()

    def record(self, *, key, seq, kind, name, status, result, error, started_at, now=False) -> None:
        record = workpool.StepRecord(
            key=key, seq=seq, kind=kind, name=name, status=status, result=result,
            error=error, attempts=1, started_at=started_at, finished_at=clock.now(),
        )
        if now:
            self._write([record])
        else:
            self.pending.append(record)

    def flush(self) -> None:
        records = self.take_pending()
        if records:
            self._write(records)
            if faults.active:
                for record in records:
                    faults.hit("after_checkpoint_commit", record.key)

    def take_pending(self) -> list:
        """The buffered entries, to be written now or with the run's outcome or suspension."""
        records, self.pending = self.pending, []
        if faults.active:
            for record in records:
                faults.hit("before_checkpoint_commit", record.key)
        return records

    def _write(self, records) -> None:
        try:
            workpool.record_steps(self.claim, records)
        except DatabaseError as exc:
            # Our checkpoint failed, not the workflow: this must not become the run's error.
            raise DatabaseUnavailable(str(exc)) from exc


def advance(claim: workpool.Claim, should_stop: Callable[[], bool] = lambda: False) -> str:
    """Run the workflow of `claim`'s run as far as it can go; return what became of the run."""
    run = claim.run
    if run is None:
        # Finished (or deleted) while the wakeup was queued: free the item, change nothing.
        workpool.finish_run(claim, status=RunStatus.COMPLETED, result=None, error=None)
        return "already finished"
    journal = {key: Entry(seq, kind, name, status, result, error)
               for key, seq, kind, name, status, result, error in run.journal}
    if not journal:
        logger.info("Run %s of %s started (delivery %d).", claim.run_id, run.workflow, claim.attempts)

    try:
        definition = registry.get(run.workflow)
        arguments = serialization.decode(run.input)
        args, kwargs = arguments.get("args", []), arguments.get("kwargs", {})
    except WorkflowNotFound as exc:
        return _finish(claim, run, RunStatus.FAILED, error=_error_text(exc, with_traceback=False))
    except (ValueError, TypeError, AttributeError, RecursionError) as exc:
        exc = ValueError(f"The run's stored input cannot be read: {exc}")
        return _finish(claim, run, RunStatus.FAILED, error=_error_text(exc, with_traceback=False))

    session = Session(claim, should_stop)
    context = Context(
        run_id=claim.run_id, workflow=run.workflow, attempt=run.attempt,
        journal=journal, session=session,
    )
    try:
        value = definition.fn(context, *args, **kwargs)
    except Suspend as suspend:
        released = workpool.release(claim, run_status=RunStatus.WAITING, waiting_on=suspend.waiting_on,
                                    records=session.take_pending())
        return "waiting" if released else "lost"
    except Preempted:
        return "released" if workpool.release(claim, run_status=RunStatus.PENDING) else "lost"
    except LeaseLost:
        return "lost"
    except Exception as exc:
        return _finish(claim, run, RunStatus.FAILED, error=_error_text(exc), records=session.take_pending())
    try:
        result = serialization.encode(
            value, what="workflow result", max_bytes=conf.get("MAX_PAYLOAD_BYTES")
        )
    except (TypeError, ValueError) as exc:
        return _finish(claim, run, RunStatus.FAILED, error=_error_text(exc), records=session.take_pending())
    return _finish(claim, run, RunStatus.COMPLETED, result=result, records=session.take_pending())


def _finish(claim, run, status, *, result=None, error=None, records=()) -> str:
    if not workpool.finish_run(claim, status=status, result=result, error=error, records=records):
        return "lost"
    if faults.active:
        for record in records:
            faults.hit("after_checkpoint_commit", record.key)
    logger.info("Run %s of %s %s.", claim.run_id, run.workflow, status)
    return status


def _error_text(exc: BaseException, *, with_traceback: bool = True) -> str:
    text = "".join(traceback.format_exception(exc, chain=not isinstance(exc, StepFailed))) if with_traceback else ""
    if isinstance(exc, StepFailed) and exc.traceback:
        # On a replay the step's own traceback is no longer on the stack: keep the recorded one.
        text = f"{exc.traceback}\nThe failure of step {exc.key!r} ended the workflow:\n\n{text}"
    return serialization.dumps_error(exc, text)
