"""Composition: parallel branches run by any worker, child workflows, and compensation (sagas)."""

from __future__ import annotations

import contextvars
import datetime as dt
import sys
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from .. import clock, ids, registry, serialization, telemetry
from ..journal import fingerprint
from ..exceptions import ChildFailed, StepFailed
from ..interrupts import CompensationFailed, Pause, Suspend
from ..retry import RetryPolicy

if TYPE_CHECKING:
    from .live import StepStreams


@dataclass(frozen=True)
class StepInfo:
    """What a running step may know about itself (``durable.current_step()``)."""

    run_id: uuid.UUID
    workflow: str
    key: str
    attempt: int

    def write_stream(self, name: str, value: Any) -> None:
        """Append `value` (JSON) to the run's stream `name` now, while the step runs: committed at
        once, so durable.read_stream() and the run's event stream give it before the step returns.

        Each value carries the step's key and attempt. When the step runs again (it raised and is
        retried, or its worker died), each stream this attempt wrote to first gets a marker that
        says so (durable.AbandonedValues), then the new attempt's values: readers never get a value
        twice without being told. From a step's own code only (not an atomic step, whose writes
        would commit with it, nor a parallel branch); in an async step, ``await awrite_stream()``.
        """
        running = _running.get()
        if running is None or running.info is not self:
            raise RuntimeError("write_stream() is for the step's own code while it runs (durable.current_step()).")
        streams = running.streams
        if streams is None:
            raise RuntimeError(
                f"Step {self.key!r} cannot write to its run's streams while it runs: it is atomic (its writes commit "
                f"with it, not as they happen) or a parallel branch. Return the values and write them from the "
                f"workflow with ctx.write_stream()."
            )
        if _in_event_loop():
            raise TypeError("An async step writes with `await durable.current_step().awrite_stream(name, value)`.")
        streams.write(name, value)

    async def awrite_stream(self, name: str, value: Any) -> None:
        """write_stream() for an async step: the write runs in a thread of its own (with a
        database connection of its own, closed when the step ends), as the async ORM's queries do."""
        from .live import awrite

        running = _running.get()
        await awrite(running.streams if running is not None else None, self.write_stream, name, value)

    @property
    def previous_error(self) -> dict | None:
        """The error of this step's attempt before this one, {"type", "message", "attempt"}, or None
        on a first attempt: a retry may act on why the last one failed."""
        running = _running.get()
        previous = running.previous if running is not None and running.info is self else None
        if not previous:
            return None
        error = serialization.decode(previous)
        if not isinstance(error, dict):
            return None
        return {"type": error.get("type", ""), "message": error.get("message", ""), "attempt": error.get("attempt")}

    @property
    def cancel_requested(self) -> bool:
        """True once someone asked to cancel the run: a long step may stop early (raise durable.Cancelled)."""
        running = _running.get()
        claim = running.claim if running is not None else None
        return bool(claim is not None and claim.run_id == self.run_id and claim.cancel_requested)


class _Step(NamedTuple):
    """The step running now: one context variable, set and reset once a step."""

    info: StepInfo
    claim: Any  # its run's claim
    previous: str | None  # the error of its attempt before this one (JSON), for StepInfo.previous_error
    streams: StepStreams | None  # its writer to its run's streams (engine/live.py), None where it may not write


_running: contextvars.ContextVar[_Step | None] = contextvars.ContextVar("durable_step", default=None)


def _in_event_loop() -> bool:
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def get_current_step() -> StepInfo | None:
    """Return the StepInfo of the step running now in this thread, or None outside a step."""
    running = _running.get()
    return running.info if running is not None else None


def current_step(run_id, workflow: str, key: str, attempt: int, claim=None, previous: str | None = None,
                 streams: StepStreams | None = None) -> _Running:
    """Set durable.current_step() for the code run under it: `with current_step(...):`."""
    return _Running(_Step(StepInfo(run_id, workflow, key, attempt), claim, previous, streams))


class _Running:
    """The step running now, as a context manager of its own (not a generator's): it wraps every step."""

    __slots__ = ("value", "token")

    def __init__(self, value):
        self.value = value

    def __enter__(self) -> None:
        self.token = _running.set(self.value)

    def __exit__(self, *exc) -> bool:
        _running.reset(self.token)
        return False


@dataclass(frozen=True)
class Call:
    """One branch of ctx.parallel(): made by ctx.call(), run by whichever worker claims it."""

    key: str
    fn: Callable
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    retry: RetryPolicy | None = None
    timeout: float | None = None
    cancellable: bool = True


class ChildHandle:
    """A child run started with ctx.start_child(); result() waits for it inside the workflow."""

    def __init__(self, context, key: str, run_id: uuid.UUID):
        self._context = context
        self.key = key
        self.run_id = run_id

    def result(self) -> Any:
        """Return the child's result, waiting (durably) for it; raise ChildFailed if it did not complete."""
        return self._context._child_result(self.key, self.run_id)

    def __repr__(self) -> str:
        return f"<ChildHandle {self.key!r} run={self.run_id}>"


class Composition:
    """The composing half of Context."""

    # -- parallel branches ------------------------------------------------------------------

    def call(self, key: str, fn: Callable, /, *args: Any, retry: RetryPolicy | None = None,
             timeout: float | dt.timedelta | None = None, cancellable: bool = True, **kwargs: Any) -> Call:
        """Describe one branch for ctx.parallel(); nothing runs yet."""
        return Call(key, fn, args, kwargs, retry, step_timeout(timeout), bool(cancellable))

    def map(self, key: str, fn: Callable, items: Iterable, *, retry: RetryPolicy | None = None,
            timeout: float | dt.timedelta | None = None, return_exceptions: bool = False,
            cancellable: bool = True) -> list:
        """Run `fn(item)` for every item as parallel branches (keys ``<key>:<index>``); return the results in order."""
        calls = [self.call(f"{key}:{index}", fn, item, retry=retry, timeout=timeout, cancellable=cancellable)
                 for index, item in enumerate(items)]
        return self.parallel(calls, key=key, return_exceptions=return_exceptions)

    def parallel(self, calls: list[Call], *, key: str | None = None, return_exceptions: bool = False) -> list:
        """Run the calls as branches that any worker may take; return their results in order.

        The run waits without holding a worker and is advanced once, when every branch has
        finished. Each branch has its own retries and timeout. The first branch that fails for
        good raises StepFailed here and the branches not started yet are cancelled; with
        `return_exceptions`, failures are returned in the list (as StepFailed) instead.
        """
        if not calls:
            return []
        group = key or self._auto_key("parallel", "")
        self._claim_key(group, "ctx.parallel()")
        for item in calls:
            if not isinstance(item, Call):
                raise TypeError(f"ctx.parallel() takes calls made by ctx.call(), not {item!r}.")
            self._claim_key(item.key, "a branch of ctx.parallel() or ctx.map()")
        entry = self._journal.get(group)
        if entry is not None:
            self._check_same(group, entry, "parallel", "")
        else:
            self._session.before_step(group)
            entry = self._record(group, "", "waiting", None, None, self._session.now(), 1, kind="parallel",
                                 remaining=len(calls))
            items = [
                (c.key, group, name, self._branch_input(c, name, entry.seq + 1 + index, return_exceptions))
                for index, (c, name) in enumerate((c, _importable_name(c.fn)) for c in calls)
            ]
            self._next_seq = max(self._next_seq, entry.seq + len(calls) + 1)  # the branches' seqs
            raise Suspend(f"parallel {group!r}: 0 of {len(calls)} branches done", items=items)
        self._next_seq = max(self._next_seq, entry.seq + len(calls) + 1)
        branches = [self._journal.get(c.key) for c in calls]
        for call, branch in zip(calls, branches):
            if branch is not None and branch.fingerprint:
                name = _importable_name(call.fn).replace(":", ".")
                self._check_call(call.key, branch, fingerprint(name, call.fn, call.args, call.kwargs), name,
                                 call.fn, call.args, call.kwargs)
        paused = next((b for b in branches if b is not None and b.status == "paused"), None)
        if paused is not None:  # held for an operator (RetryPolicy(on_exhausted="pause")) until resumed
            self._stop_if_cancelled()
            raise Pause(paused_waiting_on(paused.key, paused.attempts, paused.error))
        finished = [b for b in branches if b is not None and b.status in ("completed", "failed")]
        failures = [b for b in finished if b.status == "failed"]
        if failures and not return_exceptions:
            first = failures[0]
            if entry.status != "failed":
                self._record(group, "", "failed", None, first.error, self._session.now(), 1, kind="parallel")
            raise StepFailed(first.key, serialization.decode(first.error), attempts=first.attempts)
        if len(finished) < len(calls):
            self._stop_if_cancelled()
            raise Suspend(f"parallel {group!r}: {len(finished)} of {len(calls)} branches done")
        if entry.status != "completed":
            self._record(group, "", "completed", None, None, self._session.now(), 1, kind="parallel",
                         derivable=True)
        return [
            serialization.decode(b.result) if b.status == "completed"
            else StepFailed(b.key, serialization.decode(b.error), attempts=b.attempts)
            for b in branches
        ]

    def _branch_input(self, call: Call, name: str, seq: int, return_exceptions: bool) -> str:
        policy = call.retry or self._retry
        return serialization.encode(
            {
                "seq": seq,
                "fingerprint": fingerprint(name.replace(":", "."), call.fn, call.args, call.kwargs),
                "args": list(call.args),
                "kwargs": call.kwargs,
                "retry": {
                    "max_attempts": policy.max_attempts,
                    "initial_backoff": policy.initial_backoff,
                    "backoff_coefficient": policy.backoff_coefficient,
                    "max_backoff": policy.max_backoff,
                    "jitter": policy.jitter,
                    "non_retryable": [_importable_name(t) for t in policy.non_retryable],
                    **({"on_exhausted": policy.on_exhausted} if policy.on_exhausted != "fail" else {}),
                },
                "timeout": call.timeout,
                "return_exceptions": return_exceptions,
                **({} if call.cancellable else {"cancellable": False}),
                **telemetry.carried(),  # the branch's span joins the run's trace
            },
            what=f"arguments of branch {call.key!r}",
        )

    # -- child workflows ----------------------------------------------------------------------

    def start_child(self, key: str, workflow: str | Callable, /, *args: Any, detached: bool = False,
                    **kwargs: Any) -> ChildHandle:
        """Start `workflow` as a child run, once for this key; return a handle to wait on it (or not).

        The child's id is derived from this run's id and `key`, so a replay never starts it twice.
        When this run ends other than ``completed`` (failed, timed out, cancelled...), its
        unfinished children are cancelled with it, unless started with ``detached=True``: a
        fire-and-forget child that must outlive its parent's failure.
        """
        self._claim_key(key, "ctx.start_child()")
        definition = registry.get(workflow)
        entry = self._journal.get(key)
        self._prints[key] = call = fingerprint(definition.name, None, args, kwargs)
        if entry is not None:
            self._check_same(key, entry, "child", definition.name)
            self._check_call(key, entry, call, f"child workflow {definition.name}", None, args, kwargs)
            child_id = _recorded_child(entry) or ids.child_id(self.run_id, key)
        else:
            self._session.before_step(key)  # earlier checkpoints first: the child is an effect
            child_id = self._session.start_child(ids.child_id(self.run_id, key), definition, args, kwargs,
                                                 detached=detached, legacy_id=ids.legacy_child_of(self.run_id, key))
            self._record(key, definition.name, "waiting", serialization.encode(str(child_id)), None,
                         self._session.now(), 1, kind="child")
        return ChildHandle(self, key, child_id)

    def child(self, key: str, workflow: str | Callable, /, *args: Any, **kwargs: Any) -> Any:
        """Start `workflow` as a child run and return its result; raise ChildFailed if it did not complete."""
        return self.start_child(key, workflow, *args, **kwargs).result()

    def _child_result(self, key: str, child_id: uuid.UUID) -> Any:
        entry = self._journal[key]
        if entry.status in ("completed", "failed"):
            if entry.status == "failed":
                raise ChildFailed(child_id, serialization.decode(entry.error))
            return serialization.decode(entry.result)
        finished = self._session.finished_child(child_id)
        if finished is None:
            self._stop_if_cancelled()
            raise Suspend(f"child workflow {key!r} ({child_id})")
        status, result, error = finished
        now = self._session.now()
        if status == "completed":
            self._record(key, entry.name, "completed", result, None, now, 1, kind="child")
            return serialization.decode(result)
        error = error or serialization.dumps_error(ChildFailed(child_id, {"message": f"it ended {status}"}))
        failure = dict(serialization.decode(error), status=status)
        error = serialization.encode(failure)
        self._record(key, entry.name, "failed", None, error, now, 1, kind="child")
        raise ChildFailed(child_id, failure)

    # -- compensation -------------------------------------------------------------------------

    def rollback(self) -> None:
        """Run the compensations of the completed steps, newest first, each as a durable step.

        Each compensation is called with its step's result, retried like any step, and recorded
        (keys ``rollback:<step key>``), so a crash resumes the rollback where it stopped. If one
        fails for good the run ends ``compensation_failed``. Then return to the workflow.
        """
        self._session.rolling_back = True
        try:
            while self._compensations:
                key, undo, result = self._compensations[-1]
                try:
                    self._step(f"rollback:{key}", undo, (result,), {}, atomic=False, retry=None, timeout=None,
                               kind="rollback", cancellable=False)
                except StepFailed as failure:
                    raise CompensationFailed(failure) from failure
                self._compensations.pop()
        finally:
            self._session.rolling_back = False


def _recorded_child(entry) -> uuid.UUID | None:
    """The id a child's journal entry holds while it waits for the child (its result, after)."""
    if entry.status in ("completed", "failed"):
        return None
    return uuid.UUID(serialization.decode(entry.result))


def paused_waiting_on(key, attempts, error) -> str:
    """Why a paused run waits: the step and its error's type (not its message: `waiting_on` is
    shown to those who may not see payloads)."""
    parts = serialization.error_parts(error, limit=200) if error else None
    kind = str((parts or {}).get("type") or "an error").rpartition(".")[2]
    return f"an operator: step {key!r} failed {attempts} time{'s' if attempts != 1 else ''} ({kind})"


def step_timeout(timeout) -> float | None:
    """A step's or a branch's `timeout=` in seconds (None: none); ValueError for a bad one."""
    return None if timeout is None else clock.seconds(timeout, "A step timeout", zero=False)


def _importable_name(obj) -> str:
    """Return module.qualname for a function a worker can find again; raise ValueError otherwise."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", "")
    found = resolve(f"{module}:{qualname}") if module and "<" not in qualname else None
    if found is not obj:
        raise ValueError(
            f"{obj!r} cannot run as a parallel branch: use a function defined at module level "
            f"(not a lambda, a nested function or a bound method), so that any worker can find it."
        )
    return f"{module}:{qualname}"


def resolve(name: str):
    """Return the object named module.qualname (or module:qualname) among the modules already loaded.

    Nothing is imported: a branch can only name code that the worker loaded with its workflows.
    """
    module_name, _, qualname = name.partition(":") if ":" in name else name.rpartition(".")
    module = sys.modules.get(module_name)
    obj = module
    for part in qualname.split(".") if module is not None else ():
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj if module is not None else None
