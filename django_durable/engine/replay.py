"""Advancing a run: replay the workflow function against its journal, then record the outcome."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable

from django.db import DatabaseError

from .. import clock, conf, registry, serialization, workpool
from ..exceptions import StepFailed, WorkflowNotFound
from ..interrupts import DatabaseUnavailable, LeaseLost, Preempted, Suspend
from ..models import Step, WorkflowRun
from .context import Context, Entry

logger = logging.getLogger("django_durable.worker")

RunStatus = WorkflowRun.Status


class Session:
    """Binds a Context to the claim under which its run advances."""

    def __init__(self, claim: workpool.Claim, should_stop: Callable[[], bool]):
        self.claim = claim
        self.db = claim.db
        self._should_stop = should_stop

    def check(self) -> None:
        """Raise LeaseLost if the claim may have expired, Preempted if the worker is stopping.

        Called before every new step: no step starts without a live lease. The lease is
        checked against the local monotonic clock, so this costs no round trip; the previous
        checkpoint's fenced write already proved the claim was ours a moment ago.
        """
        if not self.claim.alive():
            raise LeaseLost("lease expired")
        if self._should_stop():
            raise Preempted()

    def now(self):
        return clock.now()

    def record(self, *, key, seq, kind, name, status, result, error, started_at) -> None:
        record = workpool.StepRecord(
            key=key, seq=seq, kind=kind, name=name, status=status, result=result,
            error=error, attempts=1, started_at=started_at, finished_at=clock.now(),
        )
        try:
            workpool.record_step(self.claim, record)
        except DatabaseError as exc:
            # Our checkpoint failed, not the workflow: this must not become the run's error.
            raise DatabaseUnavailable(str(exc)) from exc


def advance(claim: workpool.Claim, should_stop: Callable[[], bool] = lambda: False) -> str:
    """Run the workflow of `claim`'s run as far as it can go; return what became of the run."""
    db = claim.db
    run = (
        WorkflowRun.objects.using(db)
        .filter(id=claim.run_id)
        .values("workflow", "status", "input", "attempt", "started_at")
        .first()
    )
    if run is None or run["status"] in WorkflowRun.TERMINAL:
        # Finished (or deleted) while the wakeup was queued: free the item, change nothing.
        workpool.finish_run(claim, status=RunStatus.COMPLETED, result=None, error=None)
        return "already finished"
    journal = {
        key: Entry(seq, kind, name, status, result, error)
        for key, seq, kind, name, status, result, error in Step.objects.using(db)
        .filter(run_id=claim.run_id)
        .values_list("key", "seq", "kind", "name", "status", "result", "error")
    }
    if not journal:
        logger.info("Run %s of %s started (delivery %d).", claim.run_id, run["workflow"], claim.attempts)

    try:
        definition = registry.get(run["workflow"])
        arguments = serialization.decode(run["input"])
        args, kwargs = arguments.get("args", []), arguments.get("kwargs", {})
    except WorkflowNotFound as exc:
        return _finish(claim, run, RunStatus.FAILED, error=_error_text(exc, with_traceback=False))
    except (ValueError, TypeError, AttributeError, RecursionError) as exc:
        exc = ValueError(f"The run's stored input cannot be read: {exc}")
        return _finish(claim, run, RunStatus.FAILED, error=_error_text(exc, with_traceback=False))

    context = Context(
        run_id=claim.run_id, workflow=run["workflow"], attempt=run["attempt"],
        journal=journal, session=Session(claim, should_stop),
    )
    try:
        value = definition.fn(context, *args, **kwargs)
    except Suspend as suspend:
        return "waiting" if workpool.release(claim, run_status=RunStatus.WAITING,
                                          waiting_on=suspend.waiting_on) else "lost"
    except Preempted:
        return "released" if workpool.release(claim, run_status=RunStatus.PENDING) else "lost"
    except LeaseLost:
        return "lost"
    except Exception as exc:
        return _finish(claim, run, RunStatus.FAILED, error=_error_text(exc))
    try:
        result = serialization.encode(
            value, what="workflow result", max_bytes=conf.get("MAX_PAYLOAD_BYTES")
        )
    except (TypeError, ValueError) as exc:
        return _finish(claim, run, RunStatus.FAILED, error=_error_text(exc))
    return _finish(claim, run, RunStatus.COMPLETED, result=result)


def _finish(claim, run, status, *, result=None, error=None) -> str:
    if not workpool.finish_run(claim, status=status, result=result, error=error):
        return "lost"
    logger.info("Run %s of %s %s.", claim.run_id, run["workflow"], status)
    return status


def _error_text(exc: BaseException, *, with_traceback: bool = True) -> str:
    text = "".join(traceback.format_exception(exc, chain=not isinstance(exc, StepFailed))) if with_traceback else ""
    if isinstance(exc, StepFailed) and exc.traceback:
        # On a replay the step's own traceback is no longer on the stack: keep the recorded one.
        text = f"{exc.traceback}\nThe failure of step {exc.key!r} ended the workflow:\n\n{text}"
    return serialization.dumps_error(exc, text)
