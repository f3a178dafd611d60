"""Advancing a run: replay the workflow function against its journal, then record the outcome."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import traceback
from collections.abc import Callable

from django.db import DatabaseError

from .. import conf, faults, registry, retry, serialization, signals, telemetry, workpool
from ..exceptions import CODE_FAILURES, NonDeterminismError, StepFailed, WorkflowNotFound, WorkflowTimeout
from ..interrupts import (
    CancelRequested,
    CompensationFailed,
    DatabaseUnavailable,
    LeaseLost,
    Pause,
    Preempted,
    RunTimedOut,
    Suspend,
)
from ..models import WorkflowEvent, WorkflowRun
from ..approvers import open_approval
from ..workpool import Outcome, endings
from ..workpool.messages import take_stored_event
from ..workpool.runs import create_run
from . import asyncs
from .alarm import Alarm
from .context import Context
from ..journal import as_datetime

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

    def __init__(self, claim: workpool.Claim, workflow: str, should_stop: Callable[[], bool]):
        self.claim = claim
        self.db = claim.db
        self.workflow = workflow
        self._should_stop = should_stop
        self.pending: list[workpool.StepRecord] = []
        # Entries a replay would derive again by itself (a sleep that ended): they ride along
        # with the next write but never cause one.
        self.derivable: set[str] = set()
        self.deadline = as_datetime(claim.run.deadline_at) if claim.run and claim.run.deadline_at else None
        self.alarm = Alarm(self)
        self.messages = list(claim.run.messages) if claim.run else []  # unconsumed, oldest first
        # What to claim in the statement that ends this advance (see advance()).
        self.chain: Callable[[], workpool.ClaimRequest | None] = lambda: None
        self.rolling_back = False  # compensations run even after a cancel request
        self.event_waits: dict[str, tuple] = {}  # event waits this advance began: key -> (name, match, since)
        self._children = {str(c.id): (c.status, c.result, c.error) for c in claim.run.children} \
            if claim.run and claim.run.children else {}

    def start_child(self, child_id, definition, args, kwargs, detached: bool = False, legacy_id=None):
        """Create the child run (idempotent: its id is derived from this run and the key); return
        its id, `legacy_id` if this run started the child under that id before (ids.legacy_child_of)."""
        try:
            if legacy_id is not None and WorkflowRun.objects.using(self.db).filter(
                    pk=legacy_id, parent_id=self.claim.run_id).exists():
                return legacy_id
            create_run(definition, list(args), kwargs, run_id=child_id, parent_id=self.claim.run_id,
                       detached=detached)
        except DatabaseError as exc:
            raise DatabaseUnavailable(str(exc)) from exc
        return child_id

    def finished_child(self, child_id) -> tuple | None:
        """(status, result, error) of a child that had finished when this run was claimed, or None."""
        return self._children.get(str(child_id))

    def take_message(self, kind: str, name: str, key: str, before: dt.datetime | None = None) -> tuple[int, str] | None:
        """The oldest unconsumed signal `name`, or the event delivered to the wait `key`.

        With `before` (a wait's deadline), only a message stored by then (the database's
        clock) counts: one that came after the wait timed out is left for a later wait, even
        when no worker replayed the run in between.
        """
        for index, message in enumerate(self.messages):
            if message.kind != kind:
                continue
            if (kind == "signal" and message.name == name) or (kind != "signal" and message.target_key == key):
                if before is not None and as_datetime(message.created_at) > before:
                    continue
                del self.messages[index]
                return message.id, message.payload
        return None

    def open_approval(self, key: str, spec: dict, quorum: int, message: str, data: str, deadline) -> None:
        """Store the approval the wait `key` asks for (approvers.open_approval; idempotent)."""
        try:
            open_approval(self.claim.run_id, key, spec, quorum, message, data, deadline, self.db)
        except DatabaseError as exc:
            raise DatabaseUnavailable(str(exc)) from exc

    def take_stored_event(self, key: str, name: str, match: str, since) -> tuple[int, str] | None:
        """A kept event `name` emitted before the wait `key` began that fits its `match` (JSON),
        delivered to the wait (workpool.messages.take_stored_event), or None."""
        try:
            return take_stored_event(self.claim.run_id, key, name, serialization.decode(match) or {}, since,
                                     self.db)
        except DatabaseError as exc:
            raise DatabaseUnavailable(str(exc)) from exc

    def look_again_for_events(self) -> None:
        """After this advance's new event waits committed: give each a kept event emitted while it
        was being recorded (emit_event delivered it to no wait, not seeing this one yet), and wake
        the run for it. Best effort: an error here leaves the wait waiting for the next event."""
        waits, self.event_waits = self.event_waits, {}
        try:
            for key, (name, match, since) in waits.items():
                if take_stored_event(self.claim.run_id, key, name, serialization.decode(match) or {}, since,
                                     self.db) is not None:
                    workpool.wake([self.claim.run_id], db=self.db)
        except DatabaseError as exc:
            logger.warning("Run %s: could not look for events emitted while it began to wait (%s).",
                           self.claim.run_id, exc)

    def now(self):
        """The database's clock, estimated without a round trip, never behind it (see Claim.db_now)."""
        return self.claim.db_now()

    def passed(self, when) -> bool:
        """True only if `when` has surely passed on the database's clock."""
        return self.claim.db_passed(when)

    def before_step(self, key: str, running: workpool.StepRecord | None = None) -> None:
        """Make the journal durable before a step starts (with its `running` entry, if any).

        Raise LeaseLost if the claim may be gone, RunTimedOut past the run's deadline,
        CancelRequested if someone asked to cancel the run, Preempted if the worker is stopping.
        The lease is checked against the local monotonic clock, so no new step starts without a
        live lease at no cost of a round trip.
        """
        if self.deadline is not None and self.passed(self.deadline):
            raise RunTimedOut()
        if running is not None:
            self.pending.append(running)
        self.flush()
        # After the flush: a pause (GC, SIGSTOP) between that write and this check must not
        # let a worker whose lease lapsed meanwhile start the step.
        if not self.claim.alive():
            raise LeaseLost("lease expired")
        if self.claim.cancel_requested and not self.rolling_back:
            raise CancelRequested()
        if self._should_stop():
            raise Preempted()
        if self.claim.attempts > 1:
            # A redelivery: a worker died during this advance. Note each step as it starts, so
            # that if this one dies too, the poison report can name the step.
            workpool.note_step(self.claim, key)

    def record(self, record: workpool.StepRecord, now: bool = False, derivable: bool = False) -> None:
        """Buffer `record`, or with `now` write it at once (an atomic step, in its transaction)."""
        if now:
            try:
                workpool.record_steps(self.claim, [record])
            except DatabaseError as exc:
                raise DatabaseUnavailable(str(exc)) from exc  # the step's transaction rolls back
        else:
            self.pending.append(record)
            if derivable:
                self.derivable.add(record.key)

    def flush(self) -> None:
        if not self.pending or self.derivable and all(record.key in self.derivable for record in self.pending):
            return
        records, self.pending = _latest(self.pending), []
        try:
            self._before_commit(records)
            workpool.record_steps(self.claim, records)
            self._after_commit(records)
        except DatabaseError as exc:
            # Our checkpoint failed, not the workflow: this must not become the run's error.
            # If the commit went through and only its answer was lost, the rows are there.
            if not workpool.recorded(self.claim, records):
                raise DatabaseUnavailable(str(exc)) from exc
            logger.warning("Run %s: a checkpoint committed although its answer was lost (%s).",
                           self.claim.run_id, exc)
        self._announce(records)

    def take_pending(self) -> list:
        """The buffered entries, to be written with the run's outcome or suspension."""
        if not self.pending:
            return []
        records, self.pending = _latest(self.pending), []
        self._before_commit(records)
        return records

    def _before_commit(self, records) -> None:
        if faults.active:
            for record in records:
                faults.hit("before_checkpoint_commit", record.key)

    def committed(self, records) -> None:
        """`records` were written with a commit of their own (an outcome, a suspension, an atomic step)."""
        if not records:
            return
        self._after_commit(records)
        self._announce(records)

    def _after_commit(self, records) -> None:
        if faults.active:
            for record in records:
                faults.hit("after_checkpoint_commit", record.key)

    def _announce(self, records) -> None:
        for record in records:
            if record.kind != "step":
                if record.kind in _TOLD:
                    self._told(record)
                continue
            if record.status == "completed":
                # Decoded only for receivers (a result stored apart would be read back otherwise).
                if signals.listened(signals.step_completed, self.workflow):
                    signals.send(signals.step_completed, self.workflow, run_id=self.claim.run_id, key=record.key,
                                 result=serialization.decode(record.result), attempts=record.attempts)
            elif record.status in ("failed", "retrying", "paused"):
                self._step_failed(record.key, record.error, record.attempts, record.status == "retrying")

    def _told(self, record) -> None:
        """The signal of a note, a progress or an emitted event, once its entry has committed."""
        told = serialization.decode(record.result) or {}
        if record.kind == "log":
            signals.send(signals.run_noted, self.workflow, run_id=self.claim.run_id, key=record.key,
                         message=told.get("message", ""), data=told.get("data", {}))
        elif record.kind == "progress":
            signals.send(signals.run_progress, self.workflow, run_id=self.claim.run_id, done=told.get("done"),
                         total=told.get("total"), message=told.get("message", ""))
        elif record.status == "completed":  # emit
            signals.send(signals.run_emitted, self.workflow, run_id=self.claim.run_id, name=record.name,
                         payload=told.get("payload"), delivered=told.get("delivered", 0))

    def attempt_failed(self, key: str, error: str, attempt: int) -> None:
        """An attempt failed and is retried at once, without a back-off (nothing to commit)."""
        self._step_failed(key, error, attempt, True)

    def _step_failed(self, key, error, attempt, will_retry) -> None:
        signals.send(signals.step_failed, self.workflow, run_id=self.claim.run_id, key=key,
                     error=serialization.decode(error), attempt=attempt, will_retry=will_retry)


_TOLD = frozenset({"log", "progress", "emit"})


def _latest(records: list) -> list:
    """One entry per key, the latest (a wait may be recorded waiting, then done, before a write)."""
    latest: dict = {}
    for record in records:
        earlier = latest.get(record.key)
        if earlier is not None and earlier.consumes is not None and record.consumes is None:
            record = dataclasses.replace(record, consumes=earlier.consumes)
        latest[record.key] = record
    return list(latest.values())


def advance(claim: workpool.Claim, should_stop: Callable[[], bool] = lambda: False,
            chain: Callable[[], workpool.ClaimRequest | None] = lambda: None) -> Outcome:
    """Run the workflow of `claim`'s run as far as it can go; return what became of the run.

    `chain()` says what to claim next in the statement that ends this advance (None: nothing);
    the new claim is left in ``claim.next_claim``.
    """
    run = claim.run
    if run is None:
        # Finished (or deleted) while the wakeup was queued: free the item, change nothing.
        if workpool.finish_run(claim, status=RunStatus.COMPLETED, result=None, error=None, then=chain()) is None:
            return Outcome.LOST
        return Outcome.ALREADY_FINISHED
    with telemetry.run_span(claim.run_id, run.workflow, telemetry.traceparent_of(run.input), attempt=run.attempt,
                            delivery=claim.attempts):
        return _advance(claim, run, should_stop, chain)


def _advance(claim, run, should_stop, chain) -> Outcome:
    session = Session(claim, run.workflow, should_stop)
    session.chain = chain
    definition = registry.find(run.workflow)
    if run.cancel_requested and not (definition and definition.compensate_on_cancel):
        return _finish(claim, run, RunStatus.CANCELLED, session=session)
    if session.deadline is not None and session.passed(session.deadline):
        return _timed_out(claim, run, session)
    journal = {
        e.key: workpool.StepRecord(e.key, e.seq, e.kind, e.name, e.status, e.result, e.error, e.attempts, None, None,
                                   e.deadline_at, e.retry_at, e.match, fingerprint=e.fingerprint)
        for e in run.journal
    } if run.journal else {}
    if not journal and run.attempt == 1:
        if logger.isEnabledFor(logging.INFO):  # asked here, not in logger.info(): a call less a run while off
            logger.info("Run %s of %s started (delivery %d).", claim.run_id, run.workflow, claim.attempts)
        signals.send(signals.run_started, run.workflow, run_id=claim.run_id)

    try:
        definition = definition or registry.load(run.workflow)  # a task's module may be imported now
        arguments = serialization.decode(run.input)
        args, kwargs = arguments.get("args", []), arguments.get("kwargs", {})
    except WorkflowNotFound:
        return _missing_workflow(claim, run, session)
    except (ValueError, TypeError, AttributeError, RecursionError) as exc:
        exc = ValueError(f"The run's stored input cannot be read: {exc}")
        return _finish(claim, run, RunStatus.FAILED, error=_error_text(exc, with_traceback=False))

    context = Context(
        run_id=claim.run_id, workflow=run.workflow, attempt=run.attempt, journal=journal,
        session=session, retry=definition.retry or retry.from_setting(conf.get("DEFAULT_RETRY")),
    )
    try:
        value = _call(definition, context, args, kwargs)
    except NonDeterminismError as exc:
        return _block(claim, run, session, exc)
    except Pause as pause:
        return _pause(claim, run, session, pause)
    except Suspend as suspend:
        return _wait(claim, session, suspend)
    except Preempted:
        return _released(claim)
    except LeaseLost:
        return Outcome.LOST
    except RunTimedOut:
        return _timed_out(claim, run, session)
    except CancelRequested:
        if definition.compensate_on_cancel:
            return _compensate(claim, run, session, context, RunStatus.CANCELLED)
        return _finish(claim, run, RunStatus.CANCELLED, session=session)
    except CompensationFailed as failed:
        return _finish(claim, run, RunStatus.COMPENSATION_FAILED, error=_error_text(failed.failure), session=session)
    except CODE_FAILURES as exc:
        if run.attempt < run.max_attempts and _retried(exc, definition):
            return _retry_run(claim, run, session, exc, definition)
        if definition.compensate_on_failure:
            return _compensate(claim, run, session, context, RunStatus.FAILED, _error_text(exc))
        return _finish(claim, run, RunStatus.FAILED, error=_error_text(exc), session=session)
    try:
        result = serialization.encode(value, what="workflow result", max_bytes=conf.get("MAX_PAYLOAD_BYTES"),
                                      owner=claim.run_id)
    except (TypeError, ValueError) as exc:
        return _finish(claim, run, RunStatus.FAILED, error=_error_text(definition.refused_result(exc)), session=session)
    return _finish(claim, run, RunStatus.COMPLETED, result=result, session=session)


def _call(definition, context: Context, args, kwargs):
    """Run the workflow function; a divergence from the journal that its code caught (and then
    waited, raised or returned) is raised again: the run is blocked whatever the code did next."""
    try:
        value = asyncs.call_workflow(definition.fn, context, args, kwargs)
    except (Suspend, *CODE_FAILURES):
        if context.diverged is not None:
            raise context.diverged from None
        raise
    if context.diverged is not None:
        raise context.diverged
    return value


def _wait(claim, session, suspend) -> Outcome:
    """Hand the run back, waiting, with its new records, timers and branches in one fenced write."""
    records = session.take_pending()
    if not workpool.release(claim, run_status=RunStatus.WAITING, waiting_on=suspend.waiting_on,
                            records=records, timers=suspend.timers, items=suspend.items, then=session.chain()):
        return Outcome.LOST
    session.committed(records)
    if session.event_waits:
        session.look_again_for_events()
    return Outcome.WAITING


def _released(claim) -> Outcome:
    """The worker is stopping: hand the run back, ready at once for another worker."""
    return Outcome.RELEASED if workpool.release(claim, run_status=RunStatus.PENDING) else Outcome.LOST


def _block(claim, run, session, exc: NonDeterminismError) -> Outcome:
    """The code now differs from the run's journal: hold the run for an operator (``blocked``).

    Its journal keeps what this advance recorded before the difference; nothing is failed,
    compensated or retried. Its item waits like a waiting run's: a signal, a timer or the
    run's deadline wakes it and it is replayed against the code installed then, and
    durable.retry_run() (the admin's Retry) resumes it once the code is fixed.
    """
    records = session.take_pending()
    reason = f"a fix of the code: {exc}"
    if not workpool.release(claim, run_status=RunStatus.BLOCKED, waiting_on=reason, records=records,
                            then=session.chain()):
        return Outcome.LOST
    session.committed(records)
    logger.error("Run %s of %s is blocked, held for an operator: %s", claim.run_id, run.workflow, exc)
    try:
        WorkflowEvent.record(claim.run_id, WorkflowEvent.Type.BLOCKED, by=None, message=str(exc), db=claim.db)
    except DatabaseError as error:  # the run is held either way; only the trail misses it
        logger.warning("Run %s: its blocking was not written to its audit trail (%s).", claim.run_id, error)
    signals.send(signals.run_blocked, run.workflow, run_id=claim.run_id, reason=str(exc))
    return Outcome.BLOCKED


def _pause(claim, run, session, pause: Pause) -> Outcome:
    """A step failed for good under a policy that pauses: hold the run for an operator (``paused``).

    Nothing fails: its journal (the step's entry ``paused``, with its errors), waits and children
    stay. Its item waits like a waiting run's; woken (a signal, a timer), the run reaches the
    paused step again and holds again. durable.retry_run() resumes it: the step goes again with
    fresh attempts, on the code installed then. Recorded once, when the step paused.
    """
    records = session.take_pending()
    if not workpool.release(claim, run_status=RunStatus.PAUSED, waiting_on=pause.waiting_on, records=records,
                            then=session.chain()):
        return Outcome.LOST
    session.committed(records)
    paused = next((record for record in records if record.status == "paused"), None)
    if paused is not None:
        try:
            WorkflowEvent.record(claim.run_id, WorkflowEvent.Type.PAUSED, by=None, message=pause.waiting_on,
                                 data={"step": paused.key, "attempts": paused.attempts}, db=claim.db)
        except DatabaseError as error:  # the run is held either way; only the trail misses it
            logger.warning("Run %s: its pause was not written to its audit trail (%s).", claim.run_id, error)
        signals.send(signals.run_paused, run.workflow, run_id=claim.run_id, key=paused.key,
                     error=serialization.decode(paused.error))
    return Outcome.PAUSED


def _finish(claim, run, status, *, result=None, error=None, session=None) -> Outcome:
    """End the run `status`, fenced (workpool.finish_run: the one ending, which also sends its signal)."""
    records = session.take_pending() if session else []
    final = workpool.finish_run(claim, status=status, result=result, error=error, records=records,
                                then=session.chain() if session else None,
                                committed=(lambda: session.committed(records)) if session else None)
    if final is None:
        return Outcome.LOST
    if final == endings.UNCHANGED:
        return Outcome.ALREADY_FINISHED
    if final in (RunStatus.COMPLETED, RunStatus.CANCELLED):
        if logger.isEnabledFor(logging.INFO):
            logger.info("Run %s of %s %s.", claim.run_id, run.workflow, final)
    else:
        logger.error("Run %s of %s ended %s: %s", claim.run_id, run.workflow, final, serialization.error_line(error))
    return Outcome.of(final)


def _compensate(claim, run, session, context, status, error=None) -> Outcome:
    """Roll the run back (durably, resuming where an earlier advance stopped), then end it `status`."""
    try:
        context.rollback()
    except Suspend as suspend:  # a compensation waits to be retried
        return _wait(claim, session, suspend)
    except CompensationFailed as failed:
        return _finish(claim, run, RunStatus.COMPENSATION_FAILED, error=_error_text(failed.failure), session=session)
    except Preempted:
        return _released(claim)
    except LeaseLost:
        return Outcome.LOST
    except RunTimedOut:
        return _timed_out(claim, run, session)
    return _finish(claim, run, status, error=error, session=session)


def _missing_workflow(claim, run, session) -> Outcome:
    """This worker does not have the run's workflow: leave it for one that has, or fail it after the grace."""
    what = f"workflow {run.workflow!r}"
    outcome = workpool.defer_missing(claim, what)
    if outcome != Outcome.MISSING:
        return outcome
    grace = conf.get("MISSING_CODE_GRACE_SECONDS")
    exc = WorkflowNotFound(
        f"No workflow is registered under the name {run.workflow!r} in any worker that claimed this run "
        f"in {grace:g} s (DURABLE_MISSING_CODE_GRACE_SECONDS). Deploy the code that defines it and retry the run."
    )
    return _finish(claim, run, RunStatus.FAILED, error=_error_text(exc, with_traceback=False), session=session)


def _timed_out(claim, run, session) -> Outcome:
    deadline = session.deadline
    exc = WorkflowTimeout(f"The run passed its deadline of {deadline:%Y-%m-%d %H:%M:%S} UTC (the workflow's timeout).")
    return _finish(claim, run, RunStatus.TIMED_OUT, error=_error_text(exc, with_traceback=False), session=session)


def _retried(exc: Exception, definition) -> bool:
    """Whether a run whose function raised `exc` (with attempts left) goes again: not for the
    exceptions its retry policy names as not retryable, nor NonRetryableError."""
    policy = definition.retry or retry.from_setting(conf.get("DEFAULT_RETRY"))
    return policy.retries(exc, 0)  # attempt 0: the run's max_attempts counts, not the policy's


def _retry_run(claim, run, session, exc, definition) -> Outcome:
    """The workflow function raised with attempts left: go again from the last checkpoint."""
    policy = definition.retry or retry.from_setting(conf.get("DEFAULT_RETRY"))
    retry_at = session.now() + dt.timedelta(seconds=policy.delay(exc, run.attempt))
    records = session.take_pending()
    error = _error_text(exc)
    if not workpool.retry_run(claim, retry_at=retry_at, error=error, records=records,
                              waiting_on=f"retry of the run (attempt {run.attempt + 1} of {run.max_attempts}) "
                                         f"at {retry_at:%Y-%m-%d %H:%M:%S} UTC"):
        return Outcome.LOST
    session.committed(records)
    logger.warning("Run %s of %s: attempt %d of %d failed (%s); it goes again from its last checkpoint at %s UTC.",
                   claim.run_id, run.workflow, run.attempt, run.max_attempts,
                   serialization.error_line(error), f"{retry_at:%H:%M:%S}")
    return Outcome.RETRYING


def _error_text(exc: BaseException, *, with_traceback: bool = True) -> str:
    text = "".join(traceback.format_exception(exc, chain=not isinstance(exc, StepFailed))) if with_traceback else ""
    if isinstance(exc, StepFailed) and exc.traceback:
        # On a replay the step's own traceback is no longer on the stack: keep the recorded one.
        text = f"{exc.traceback}\nThe failure of step {exc.key!r} ended the workflow:\n\n{text}"
    return serialization.dumps_error(exc, text)
