"""The Context a workflow function receives: memoized steps with retries and timeouts, recorded values."""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import logging
import threading
import random as _random
import traceback
import uuid as _uuid
from collections.abc import Callable
from typing import Any

from django.db import connections, transaction

from .. import conf, faults, serialization, telemetry
from ..databases import writes_only_to
from ..exceptions import CODE_FAILURES, ApprovalTimeout, Cancelled, NonDeterminismError, SignalTimeout, StepFailed, StepTimeout
from ..interrupts import CancelRequested, Pause, Suspend
from ..retry import RetryPolicy
from . import asyncs, live
from .composition import Composition, current_step, paused_waiting_on, step_timeout
from .flow import Flow
from ..journal import as_datetime
from .waits import Waits
from ..journal import StepRecord, fingerprint

logger = logging.getLogger("django_durable.worker")

FINAL = ("completed", "failed")


class Context(Waits, Composition, Flow):
    """What a workflow function gets as its first argument.

    Every call that has an effect outside the workflow function goes through the context, so
    that a replay after a crash gives the function exactly the values the first run saw.
    """

    def __init__(self, *, run_id, workflow: str, attempt: int, journal: dict[str, StepRecord], session,
                 retry: RetryPolicy):
        self.run_id = run_id
        self.workflow = workflow
        self.attempt = attempt
        self._journal = journal
        self._session = session
        self._retry = retry
        self._next_seq = max(e.seq for e in journal.values()) + 1 if journal else 1
        self._counters: dict[str, int] = {}
        self._live = live.Index(journal)  # what steps wrote to streams while they ran
        self._on_loop = threading.Lock()  # astep() awaited on a running loop: one step at a time
        self._used: dict[str, str] = dict.fromkeys(self._live.reached, live.REACHED)  # key -> what used it
        self._compensations: list[tuple[str, Callable, Any]] = []  # (key, undo, result), in order
        self._failures: dict[str, str] = {}  # key -> the error of its last attempt retried at once
        self._prints: dict[str, str | None] = {}  # key -> the fingerprint of its call in this replay
        # The NonDeterminismError this replay raised, even if the workflow code caught it: the
        # run is then held for an operator (blocked), whatever the code did next.
        self.diverged: NonDeterminismError | None = None

    def __repr__(self) -> str:
        return f"<Context {self.workflow} run={self.run_id}>"

    # -- steps ----------------------------------------------------------------------------------

    def step(self, key: str, fn: Callable, /, *args: Any, atomic: bool = False,
             retry: RetryPolicy | None = None, timeout: float | dt.timedelta | None = None,
             compensate: Callable | None = None, cancellable: bool = True, **kwargs: Any) -> Any:
        """Run `fn(*args, **kwargs)` once for this run and return its (recorded) result.

        When `key` is already recorded, return the recorded result without calling `fn`; a
        recorded failure raises StepFailed again. A step that raises is tried again under its
        `retry` policy (else the workflow's, else DURABLE_DEFAULT_RETRY) after a durable
        back-off during which the run waits and the worker is free. `timeout` (seconds or a
        timedelta) bounds each attempt; the deadline is stored before the attempt starts. With
        ``atomic=True`` the step runs inside the database transaction that records it.
        `compensate` is called with the step's result if the run rolls back (see rollback()).
        When the run is cancelled while the step runs, ``durable.Cancelled`` is raised in it after
        DURABLE_CANCEL_GRACE_SECONDS, unless ``cancellable=False``.

        Raise StepFailed when the attempts run out (or the error is not retryable), unless the
        policy says ``on_exhausted="pause"``: then the run is held ``paused`` for an operator,
        and this call goes on, with fresh attempts, once it is resumed;
        NonDeterminismError if `key` was recorded for another function or other arguments
        (the run is then held, ``blocked``, for an operator: see docs/changing-code.md).
        """
        value = self._step(key, fn, args, kwargs, atomic=atomic, retry=retry, timeout=timeout, kind="step",
                           cancellable=cancellable)
        if compensate is not None:
            self._compensations.append((key, compensate, value))
        return value

    def _step(self, key, fn, args, kwargs, *, atomic, retry, timeout, kind, cancellable=True, name=None):
        name = name or _function_name(fn)
        self._claim_key(key, f"ctx.emit({name!r})" if kind == "emit" else f"ctx.step() of {name}")
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise TypeError(f"retry must be a durable.RetryPolicy, not {retry!r}.")
        asynchronous = asyncs.is_async(fn)
        if asynchronous and atomic:
            raise TypeError(f"Step {key!r}: an async function cannot be an atomic step (its database work would "
                            f"run outside the step's transaction, on another thread). Make it sync, or not atomic.")
        policy = retry or self._retry
        seconds = step_timeout(timeout)
        attempt, deadline = 1, None
        entry = self._journal.get(key)
        self._prints[key] = call = fingerprint(name, fn, args, kwargs)
        if entry is not None:
            self._check_same(key, entry, kind, name)
            self._check_call(key, entry, call, name, fn, args, kwargs)
            if entry.status in FINAL:
                return self._replay_final(key, entry)
            attempt, deadline = self._resume(key, name, entry, policy)
        while True:
            started = self._session.now()
            if seconds is not None and deadline is None:
                deadline = started + dt.timedelta(seconds=seconds)
            # Before the attempt starts: earlier checkpoints become durable, and a deadline is
            # stored with them, so that after a crash the attempt is judged by it.
            running = None
            if deadline is not None:
                running = self._record(key, name, "running", None, self._earlier_error(key), started, attempt,
                                       deadline=deadline, kind=kind, write=None)
            self._session.before_step(key, running)
            if self._live.writers:
                live.abandon_earlier(self, key)  # what an earlier attempt wrote to streams
            if faults.active:
                faults.hit("before_step_call", key)
            # The alarm covers the step's own code only, never the engine's checkpoint write. An
            # async step's deadline is its own (asyncio.wait_for), which cancels it cleanly.
            covered = self._covered(None if asynchronous else deadline, key, attempt, cancellable,
                                    None if atomic else live.StepStreams(self, key, attempt))
            try:
                if atomic:
                    return self._attempt_atomic(key, name, started, attempt, fn, args, kwargs, kind, covered)
                with covered:
                    value = asyncs.settled(fn(*args, **kwargs), deadline, self._session.claim, key)
            except _StepRaised as raised:
                exc = raised.__cause__
            except CODE_FAILURES as exc_:
                exc = exc_
            else:
                if faults.active:
                    faults.hit("after_step_return", key)
                try:
                    text = self._encode(value, key)
                except Exception as exc_:
                    exc = exc_
                else:
                    # Buffered: it commits before the next step starts, or with the outcome.
                    self._record(key, name, "completed", text, self._earlier_error(key), started, attempt, kind=kind)
                    return serialization.replayed(value, text)
            if isinstance(exc, Cancelled) and self._session.claim.cancel_requested:
                # Interrupted by (or stopped for) a cancel: the attempt is not recorded; the
                # run ends cancelled here, or rolls back first.
                raise CancelRequested() from exc
            attempt = self._failed_attempt(key, name, started, attempt, policy, exc, kind)
            deadline = None

    def _covered(self, deadline, key, attempt, cancellable, streams=None) -> _StepCode:
        """Where the step's own code runs: under its alarm, with durable.current_step() set."""
        return _StepCode(self._session.alarm(deadline, key, cancellable=cancellable),
                         current_step(self.run_id, self.workflow, key, attempt, self._session.claim,
                                      self._earlier_error(key) if attempt > 1 else None, streams),
                         telemetry.step_span(self.run_id, self.workflow, key, attempt), streams)

    def _attempt_atomic(self, key, name, started, attempt, fn, args, kwargs, kind, covered):
        with transaction.atomic(using=self._session.db):
            try:
                with covered, writes_only_to(self._session.db, key):
                    value = fn(*args, **kwargs)
                if faults.active:
                    faults.hit("after_step_return", key)
                text = self._encode(value, key)
            except CODE_FAILURES as exc:
                raise _StepRaised from exc  # roll the step's writes back
            record = self._record(key, name, "completed", text, self._earlier_error(key), started, attempt, kind=kind,
                                  write="now")
            if faults.active:
                faults.hit("before_checkpoint_commit", key)
        self._session.committed([record])
        return serialization.replayed(value, text)

    def _resume(self, key, name, entry: StepRecord, policy: RetryPolicy) -> tuple[int, dt.datetime | None]:
        """Return (attempt, deadline) for a step an earlier advance left running, retrying or paused."""
        if entry.status == "paused":  # held for an operator: woken (a signal, a timer), it holds again
            self._stop_if_cancelled()
            raise Pause(paused_waiting_on(key, entry.attempts, entry.error))
        if entry.status == "retrying":
            retry_at = as_datetime(entry.retry_at)
            if retry_at is not None and not self._session.passed(retry_at):
                # Woken before the back-off ended; its timer is still pending.
                raise Suspend(_retry_waiting_on(key, entry.attempts + 1, policy, retry_at))
            return entry.attempts + 1, None
        # Running: the worker of that attempt died, or was replaced after a timeout.
        deadline = as_datetime(entry.deadline_at)
        if deadline is not None and self._session.passed(deadline):
            timeout = StepTimeout(
                f"Step {key!r} ran past its deadline of {deadline:%Y-%m-%d %H:%M:%S} UTC "
                f"(attempt {entry.attempts}); its worker did not survive it."
            )
            return self._failed_attempt(key, name, None, entry.attempts, policy, timeout, entry.kind), None
        return entry.attempts, deadline

    def _failed_attempt(self, key, name, started, attempt, policy: RetryPolicy, exc: BaseException,
                        kind: str = "step") -> int:
        """Record a failed attempt; return the next attempt's number, or raise Suspend or StepFailed.

        The error keeps the errors of the attempts before it (serialization.dumps_error)."""
        error = serialization.dumps_error(exc, "".join(traceback.format_exception(exc)), attempt=attempt,
                                          earlier=self._earlier_error(key))
        if not policy.retries(exc, attempt):
            if policy.pauses(exc) and kind == "step":  # held for an operator (replay._pause), not failed
                self._record(key, name, "paused", None, error, started, attempt, kind=kind)
                log_attempt(self.run_id, key, attempt, policy, error, None, paused=True)
                raise Pause(paused_waiting_on(key, attempt, error))
            self._record(key, name, "failed", None, error, started, attempt, kind=kind)
            log_attempt(self.run_id, key, attempt, policy, error, None)
            raise StepFailed(key, serialization.decode(error), attempts=attempt) from exc
        delay = policy.delay(exc, attempt)
        if delay <= 0:
            self._failures[key] = error
            self._session.attempt_failed(key, error, attempt)  # and try again at once
            log_attempt(self.run_id, key, attempt, policy, error, 0.0)
            return attempt + 1
        retry_at = self._session.now() + dt.timedelta(seconds=delay)
        log_attempt(self.run_id, key, attempt, policy, error, delay)
        self._record(key, name, "retrying", None, error, started, attempt, retry_at=retry_at, kind=kind)
        raise Suspend(_retry_waiting_on(key, attempt + 1, policy, retry_at), timers=[("retry", key, retry_at)])

    def _earlier_error(self, key: str) -> str | None:
        """The error of the step's last failed attempt (with those before it), or None: kept on
        its later entries, so a retry that succeeds still shows why the attempts before it failed."""
        failed = self._failures.get(key)
        if failed is not None:
            return failed
        entry = self._journal.get(key)
        return entry.error if entry is not None else None

    def _encode(self, value, key):
        return serialization.encode(
            value, what=f"result of step {key!r}", max_bytes=conf.get("MAX_PAYLOAD_BYTES"), owner=self.run_id
        )

    def _stop_if_cancelled(self) -> None:
        """A run asked to cancel does not start waiting again (for a timer, a message, branches, a child)."""
        if self._session.claim.cancel_requested and not self._session.rolling_back:
            raise CancelRequested()

    def _claim_key(self, key: str, use: str = "a step") -> None:
        """Take `key` for `use` ("a step", "an approval", ...) in this replay: ValueError if it is taken."""
        self._stop_if_diverged()
        _check_key(key)
        if key in self._used:
            raise ValueError(
                f"The key {key!r} is used twice in this run, by {self._used[key]} and then by {use}; "
                f"keys must be unique within a run: rename one (in a loop, put the index or the item's id "
                f"in the key). `manage.py check` finds such clashes before a run starts."
            )
        self._used[key] = use

    def _record(self, key, name, status, result, error, started, attempts, *, kind="step",
                deadline=None, retry_at=None, match=None, consumes=None, remaining=None, write="buffer",
                derivable=False):
        """Make `key`'s journal entry (keeping its seq) and write it: buffered, "now", or not (None)."""
        entry = self._journal.get(key)
        if entry is None:
            seq = self._next_seq
            self._next_seq += 1
        else:
            seq = entry.seq
            if deadline is None and entry.attempts == attempts:
                deadline = entry.deadline_at  # the outcome of a timed attempt keeps its deadline
        record = StepRecord(
            key=key, seq=seq, kind=kind, name=name, status=status, result=result, error=error,
            attempts=attempts, started_at=started,
            finished_at=None if status == "running" else self._session.now(),
            deadline_at=deadline, retry_at=retry_at, match=match, consumes=consumes, remaining=remaining,
            fingerprint=self._prints.get(key),
        )
        self._journal[key] = record
        if write is not None:
            self._session.record(record, now=write == "now", derivable=derivable)
        return record

    def _check_same(self, key: str, entry: StepRecord, kind: str, name: str) -> None:
        if entry.kind != kind or (entry.name and name and entry.name != name):
            raise self._diverge(
                f"Step {key!r} was recorded as a {entry.kind} of {entry.name or '?'} but the "
                f"workflow code now reaches it as a {kind} of {name}. The code changed under a "
                f"running workflow; restore it, or give the new call another key."
            )

    def _check_call(self, key: str, entry: StepRecord, call: str | None, name: str, fn, args, kwargs) -> None:
        """The recorded step `key` is called with the arguments it was recorded with (when both
        fingerprints are known: entries written before fingerprints existed are not checked)."""
        if entry.fingerprint and call and entry.fingerprint != call:
            now = _call_text(fn, args, kwargs)
            raise self._diverge(
                f"Step {key!r} was recorded with other arguments than the workflow code now passes to "
                f"{name} ({now}); its recorded result belongs to the old call. The code changed under a "
                f"running workflow: restore the old arguments for the runs recorded before the change "
                f"(ctx.patched()), or give the new call another key."
            )

    def _stop_if_diverged(self) -> None:
        """After a divergence the workflow code caught, nothing more of it runs or is recorded."""
        if self.diverged is not None:
            raise NonDeterminismError(str(self.diverged))

    def _diverge(self, message: str) -> NonDeterminismError:
        """The NonDeterminismError to raise, remembered (see `diverged`)."""
        if self.diverged is None:
            self.diverged = NonDeterminismError(message)
            return self.diverged
        return NonDeterminismError(message)

    def _replay_final(self, key: str, entry: StepRecord) -> Any:
        if entry.status == "failed":
            error = serialization.decode(entry.error)
            if entry.kind == "approval":
                raise ApprovalTimeout(error.get("message", ""))
            if entry.kind in ("signal", "event"):
                raise SignalTimeout(error.get("message", ""))
            raise StepFailed(key, error, attempts=entry.attempts)
        return serialization.decode(entry.result)

    async def astep(self, key: str, fn: Callable, /, *args: Any, **kwargs: Any) -> Any:
        """step(), to await in an async workflow (the step runs when awaited; sync or async `fn`).

        Awaited on a running event loop (an agent framework's, inside a sync workflow: see
        django_durable.contrib.pydantic_ai), the step's own machinery runs on a thread of its own,
        one such step at a time, while an async `fn` runs on that loop (its clients are bound to
        it) with durable.current_step() set.
        """
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return self.step(key, fn, *args, **kwargs)  # an async workflow, driven without a loop
        call = fn
        if asyncs.is_async(fn):
            @functools.wraps(fn)
            def call(*a, **k):
                # run_coroutine_threadsafe takes this thread's context into the task it makes.
                return asyncio.run_coroutine_threadsafe(fn(*a, **k), loop).result()

        def one():
            try:
                with self._on_loop:
                    return self.step(key, call, *args, **kwargs)
            finally:
                connections.close_all()  # this thread's: the loop's executor outlives no run


        return await asyncio.to_thread(one)

    # -- recorded values ------------------------------------------------------------------------

    def now(self) -> dt.datetime:
        """Return the current time, recorded: a replay returns the same value."""
        return self._note("now", self._session.now)

    def uuid(self) -> _uuid.UUID:
        """Return a random UUID (version 4), recorded: a replay returns the same value."""
        return self._note("uuid", _uuid.uuid4)

    def random(self) -> float:
        """Return a random float in [0, 1), recorded: a replay returns the same value."""
        return self._note("random", _random.random)

    def _note(self, what: str, make: Callable[[], Any]) -> Any:
        count = self._counters.get(what, 0)
        self._counters[what] = count + 1
        key = f"{what}:{count}"
        self._stop_if_diverged()
        self._used.setdefault(key, "a recorded value")  # reached (patched() tells history still ahead from history behind)
        entry = self._journal.get(key)
        if entry is not None:
            self._check_same(key, entry, "note", what)
            return self._replay_final(key, entry)
        text = serialization.encode(make())
        self._record(key, what, "completed", text, None, self._session.now(), 1, kind="note")
        return serialization.decode(text)


class _StepCode:
    """A step's own code: under its alarm, with durable.current_step() set, the log context (or
    the step's span) naming it, and its stream writer done as it ends. As
    ``with alarm, running, span: try: ... finally: streams.done()``, in a context manager of its
    own (not a generator's): it wraps every step."""

    __slots__ = ("alarm", "running", "span", "streams")

    def __init__(self, alarm, running, span, streams):
        self.alarm, self.running, self.span, self.streams = alarm, running, span, streams

    def __enter__(self) -> None:
        self.alarm.__enter__()
        try:
            self.running.__enter__()
            try:
                self.span.__enter__()
            except BaseException:
                self.running.__exit__(None, None, None)
                raise
        except BaseException as exc:
            self.alarm.__exit__(type(exc), exc, exc.__traceback__)
            raise

    def __exit__(self, kind, exc, tb) -> bool:
        try:
            try:
                if self.streams is not None:
                    try:
                        self.streams.done()
                    except BaseException as raised:  # the span ends with it instead
                        self.span.__exit__(type(raised), raised, raised.__traceback__)
                        raise
                self.span.__exit__(kind, exc, tb)
            finally:
                self.running.__exit__(None, None, None)
        finally:
            self.alarm.__exit__(None, None, None)
        return False


class _StepRaised(Exception):
    """Carries a step's own exception out of its atomic block, so the block rolls back."""


def log_attempt(run_id, key: str, attempt: int, policy: RetryPolicy, error: str, retry_in: float | None,
                paused: bool = False) -> None:
    """One log line for a failed attempt of a step: retried (WARNING), or failed for good or its
    run paused (ERROR)."""
    if paused:
        logger.error("Run %s step %r failed at attempt %d: %s; the run is paused for an operator (retry_run() "
                     "resumes it).", run_id, key, attempt, serialization.error_line(error))
    elif retry_in is None:
        logger.error("Run %s step %r failed for good at attempt %d: %s", run_id, key, attempt,
                     serialization.error_line(error))
    else:
        logger.warning("Run %s step %r: attempt %d of %d failed (%s); retrying %s.", run_id, key, attempt,
                       policy.max_attempts, serialization.error_line(error),
                       f"in {retry_in:.1f} s" if retry_in > 0 else "at once")


def _retry_waiting_on(key, attempt, policy, retry_at) -> str:
    return (f"retry of step {key!r} (attempt {attempt} of {policy.max_attempts}) "
            f"at {retry_at:%Y-%m-%d %H:%M:%S} UTC")


def _check_key(key: str) -> None:
    if not isinstance(key, str) or not key or len(key) > 255:
        raise ValueError(f"A step key must be a non-empty string of at most 255 characters, not {key!r}.")


def _call_text(fn, args, kwargs, limit: int = 300) -> str:
    """The arguments of a call as a person reads them: "now (42, amount=10)", cut at `limit`."""
    try:
        parts = [repr(arg) for arg in args] + [f"{name}={value!r}" for name, value in kwargs.items()]
        text = f"now ({', '.join(parts)})"
    except Exception:  # a repr that raises
        text = "now with other arguments"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _function_name(fn: Callable) -> str:
    module = getattr(fn, "__module__", None) or ""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    return f"{module}.{name}"[:255] if module else name[:255]
