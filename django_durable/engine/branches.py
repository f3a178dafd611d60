"""Running one parallel branch: a step work item that any worker may take."""

from __future__ import annotations

import datetime as dt
import logging
import traceback
from collections.abc import Callable

from django.db import DatabaseError

from .. import conf, faults, serialization, signals, telemetry, workpool
from ..exceptions import CODE_FAILURES, Cancelled, NonRetryableError, StepTimeout
from ..interrupts import DatabaseUnavailable, LeaseLost
from ..retry import RetryPolicy
from ..workpool import Outcome
from . import asyncs
from .alarm import Alarm
from .composition import current_step, paused_waiting_on, resolve
from .context import log_attempt
from ..journal import as_datetime

# A paused branch's item is ready at this time, which never comes: it waits for retry_run().
HELD_UNTIL = dt.datetime(9999, 12, 31, tzinfo=dt.timezone.utc)

logger = logging.getLogger("django_durable.worker")


class BranchSession:
    """What the alarm needs of a branch: its claim, the database's clock, the run's deadline."""

    def __init__(self, claim: workpool.Claim):
        self.claim = claim
        self.deadline = as_datetime(claim.run.deadline_at) if claim.run else None

    def now(self) -> dt.datetime:
        return self.claim.db_now()


def run_branch(claim: workpool.Claim, chain: Callable[[], workpool.ClaimRequest | None] = lambda: None) -> Outcome:
    """Run the branch of `claim` once (an attempt), and record what came of it; return that.

    `chain()` says what to claim next in the statement that records it (see replay.advance).
    """
    if claim.run is None:  # its run finished meanwhile: nothing to do for it
        if not workpool.finish_branch(claim, _record(claim, {}, "failed", None, _error(RuntimeError("run finished")),
                                                     1), failed=True, fail_fast=False, then=chain()):
            return Outcome.LOST
        return Outcome.ALREADY_FINISHED
    session = BranchSession(claim)
    spec, fn, policy, problem = _load(claim)
    if fn is None and problem is None:
        return _missing_function(claim, spec, policy, chain)
    entry = claim.run.journal[0] if claim.run.journal else None
    attempt = 1
    deadline = None
    if entry is not None and entry.status in ("completed", "failed"):
        # Recorded by an earlier attempt of the run (which was retried from its last
        # checkpoint): count the recorded outcome off the new group, never run it again.
        record = _record(claim, spec, entry.status, entry.result, entry.error, entry.attempts)
        failed = entry.status == "failed"
        fail_fast = failed and not spec.get("return_exceptions", False)
        if not _write(workpool.finish_branch, claim, record, failed=failed, fail_fast=fail_fast, then=chain()):
            return Outcome.LOST
        return Outcome.REPLAYED
    if entry is not None and entry.status == "retrying":
        attempt = entry.attempts + 1
    elif entry is not None and entry.status == "running":
        attempt, deadline = entry.attempts, as_datetime(entry.deadline_at)
        if deadline is not None and claim.db_passed(deadline):
            problem = problem or StepTimeout(
                f"Branch {claim.step_key!r} ran past its deadline of {deadline:%Y-%m-%d %H:%M:%S} UTC; "
                f"its worker did not survive it."
            )
    if problem is not None:
        return _failed(claim, spec, policy, attempt, problem, session.now(), chain, deadline)
    timeout = spec.get("timeout")
    started = session.now()
    try:
        if timeout and deadline is None:
            deadline = started + dt.timedelta(seconds=timeout)
            workpool.record_steps(claim, [_record(claim, spec, "running", None, _earlier(claim), attempt, started,
                                                  deadline)])
        if not claim.alive():
            # Paused (GC, SIGSTOP, a partition) past the lease since the claim: another worker
            # may hold the branch now, so this one must not start it.
            return Outcome.LOST
    except LeaseLost:
        return Outcome.LOST
    except DatabaseError as exc:
        raise DatabaseUnavailable(str(exc)) from exc
    if faults.active:
        faults.hit("before_step_call", claim.step_key)
    try:
        asynchronous = asyncs.is_async(fn)  # its deadline is asyncio.wait_for's, not the alarm's
        with Alarm(session)(None if asynchronous else deadline, claim.step_key,
                            cancellable=spec.get("cancellable", True)), \
                current_step(claim.run_id, claim.run.workflow, claim.step_key, attempt, claim,
                             _earlier(claim) if attempt > 1 else None), \
                telemetry.step_span(claim.run_id, claim.run.workflow, claim.step_key, attempt, spec.get("trace")):
            value = asyncs.settled(fn(*spec.get("args", []), **spec.get("kwargs", {})), deadline, claim,
                                   claim.step_key)
        if faults.active:
            faults.hit("after_step_return", claim.step_key)
        text = serialization.encode(value, what=f"result of branch {claim.step_key!r}",
                                    max_bytes=conf.get("MAX_PAYLOAD_BYTES"), owner=claim.run_id)
    except CODE_FAILURES as exc:
        return _failed(claim, spec, policy, attempt, exc, started, chain, deadline)
    record = _record(claim, spec, "completed", text, _earlier(claim), attempt, started, deadline)
    if not _write(workpool.finish_branch, claim, record, failed=False, fail_fast=False, then=chain()):
        return Outcome.LOST
    signals.send(signals.step_completed, claim.run.workflow, run_id=claim.run_id, key=claim.step_key,
                 result=serialization.replayed(value, text), attempts=attempt)
    return Outcome.COMPLETED


def _load(claim):
    """The branch's arguments, function and retry policy; or the reason it cannot run."""
    spec, fn, policy = {}, None, RetryPolicy(max_attempts=1)
    try:
        spec = serialization.decode(claim.input) or {}
        retry = dict(spec.get("retry") or {})
        types = tuple(t for t in (resolve(name) for name in retry.pop("non_retryable", [])) if isinstance(t, type))
        policy = RetryPolicy(**retry, non_retryable=types) if retry else RetryPolicy()
        fn = resolve(claim.function)
        if fn is not None and not callable(fn):
            raise NonRetryableError(f"The branch's function {claim.function!r} is not a function but {fn!r}.")
    except Exception as exc:  # noqa: BLE001 - a broken branch fails, it does not crash the worker
        return spec, None, policy, exc
    return spec, fn, policy, None  # fn None: this worker does not have it


def _missing_function(claim, spec, policy, chain) -> Outcome:
    """This worker does not have the branch's function: leave it for one that has, or fail it after the grace."""
    name = claim.function.replace(":", ".")
    outcome = workpool.defer_missing(claim, f"branch function {name!r}")
    if outcome != Outcome.MISSING:
        return outcome
    exc = NonRetryableError(
        f"The branch's function {name!r} is not loaded in any worker that claimed "
        f"it in {conf.get('MISSING_CODE_GRACE_SECONDS'):g} s (DURABLE_MISSING_CODE_GRACE_SECONDS); define it "
        f"in a module that your workflows.py imports."
    )
    entry = claim.run.journal[0] if claim.run.journal else None
    attempt = entry.attempts if entry is not None and entry.status == "running" else 1
    return _failed(claim, spec, policy, attempt, exc, claim.db_now(), chain)


def _failed(claim, spec, policy, attempt, exc, started, chain, deadline=None) -> Outcome:
    error = _error(exc, attempt=attempt, earlier=_earlier(claim))
    signal_args = {"run_id": claim.run_id, "key": claim.step_key, "error": serialization.decode(error),
                   "attempt": attempt}
    # Interrupted by (or stopped for) its run's cancel: fails for good, so that its group ends
    # and the run can end cancelled (or roll back) without waiting for it.
    cancelled = isinstance(exc, Cancelled) and claim.cancel_requested
    if not cancelled and policy.retries(exc, attempt):
        delay = policy.delay(exc, attempt)
        retry_at = claim.db_now() + dt.timedelta(seconds=delay)
        record = _record(claim, spec, "retrying", None, error, attempt, started, deadline, retry_at=retry_at)
        if not _write(workpool.retry_branch, claim, record, retry_at=retry_at, then=chain()):
            return Outcome.LOST
        log_attempt(claim.run_id, claim.step_key, attempt, policy, error, delay)
        signals.send(signals.step_failed, claim.run.workflow, will_retry=True, **signal_args)
        return Outcome.RETRYING
    if not cancelled and policy.pauses(exc):
        return _paused(claim, spec, policy, attempt, error, started, deadline, chain, signal_args)
    record = _record(claim, spec, "failed", None, error, attempt, started, deadline)
    fail_fast = not spec.get("return_exceptions", False)
    if not _write(workpool.finish_branch, claim, record, failed=True, fail_fast=fail_fast, then=chain()):
        return Outcome.LOST
    log_attempt(claim.run_id, claim.step_key, attempt, policy, error, None)
    signals.send(signals.step_failed, claim.run.workflow, will_retry=False, **signal_args)
    return Outcome.FAILED


def _paused(claim, spec, policy, attempt, error, started, deadline, chain, signal_args) -> Outcome:
    """The branch ran out of attempts under a policy that pauses: its entry is recorded paused and
    its item waits, not claimable (HELD_UNTIL), uncounted in its group; its run is held paused for an
    operator, whose retry_run() makes the item ready again with fresh attempts. Its siblings go on."""
    record = _record(claim, spec, "paused", None, error, attempt, started, deadline)
    if not _write(workpool.retry_branch, claim, record, retry_at=HELD_UNTIL, then=chain()):
        return Outcome.LOST
    waiting_on = paused_waiting_on(claim.step_key, attempt, error)
    workpool.hold_paused(claim.run_id, waiting_on, db=claim.db, key=claim.step_key, attempts=attempt)
    log_attempt(claim.run_id, claim.step_key, attempt, policy, error, None, paused=True)
    signals.send(signals.step_failed, claim.run.workflow, will_retry=False, **signal_args)
    signals.send(signals.run_paused, claim.run.workflow, run_id=claim.run_id, key=claim.step_key,
                 error=signal_args["error"])
    return Outcome.PAUSED


def _write(end, claim, record, **kwargs) -> bool:
    try:
        return end(claim, record, **kwargs)
    except DatabaseError as exc:
        raise DatabaseUnavailable(str(exc)) from exc


def _record(claim, spec, status, result, error, attempt, started=None, deadline=None, retry_at=None):
    return workpool.StepRecord(
        key=claim.step_key, seq=spec.get("seq", 0), kind="step", name=claim.function.replace(":", "."),
        status=status, result=result, error=error, attempts=attempt, started_at=started,
        finished_at=None if status == "running" else claim.db_now(), deadline_at=deadline, retry_at=retry_at,
        fingerprint=spec.get("fingerprint"),
    )


def _earlier(claim) -> str | None:
    """The error of the branch's last failed attempt (with those before it), kept on its later entries."""
    entry = claim.run.journal[0] if claim.run.journal else None  # the branch's own entry, if any
    return entry.error if entry is not None else None


def _error(exc: BaseException, **kwargs) -> str:
    return serialization.dumps_error(exc, "".join(traceback.format_exception(exc)), **kwargs)
