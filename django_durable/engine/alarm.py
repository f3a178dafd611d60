"""Interrupting a step: past its deadline, past its run's deadline, or when its run is cancelled.

SIGALRM interrupts Python code and blocking system calls in the main thread: the step sees
StepTimeout, or Cancelled, or the run ends timed_out. Code that swallows it or never returns to
Python is caught by the worker's watchdog, which replaces the whole process once
`claim.step_deadline` is well past (DURABLE_STEP_KILL_GRACE_SECONDS). Outside the main thread
only the watchdog applies.

Only user code is covered: the alarm is armed around the step's function and disarmed before the
engine writes its checkpoint, so an interrupt never lands in the engine's own database write.
Steps may nest (a step's function calling ctx.step); the inner one's end re-arms the outer one's
timer instead of cancelling it.
"""

from __future__ import annotations

import datetime as dt
import signal
import threading
import time
from dataclasses import dataclass

from typing import TYPE_CHECKING

from ..exceptions import Cancelled, StepTimeout
from ..interrupts import RunTimedOut

if TYPE_CHECKING:
    from ..workpool import Claim

# A timer may fire a hair before the monotonic clock agrees that the deadline passed.
_SLACK = 0.002


@dataclass
class _Frame:
    key: str
    claim: Claim
    step_at: float | None  # time.monotonic() at which the step times out...
    step_when: dt.datetime | None  # ...and its deadline, for the message
    run_at: float | None  # time.monotonic() at which the run times out
    cancellable: bool


_frames: list[_Frame] = []  # the steps running in the main thread, outermost first
_previous_handler = None
_installed = False  # by a step, outside a worker (restored when the last step ends)
_permanent = False  # by a worker, for its life


def install() -> None:
    """Keep the handler installed for the life of the process (a worker's main thread).

    A worker's maintenance thread interrupts a cancelled run's step by sending SIGALRM to the
    main thread; with the handler always there, a signal that arrives just after the step ended
    is ignored instead of killing the process.
    """
    global _permanent
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGALRM, _on_alarm)
        _permanent = True


def interrupt(thread_id: int) -> None:
    """Ask the step running in the main thread (`thread_id`) to look at its claim now."""
    if _permanent:
        signal.pthread_kill(thread_id, signal.SIGALRM)


def _on_alarm(signum, frame):
    if not _frames:
        return  # a timer or a cancel that arrived after the step ended
    now = time.monotonic() + _SLACK
    due = [(at, f) for f in _frames for at in (f.step_at, f.run_at) if at is not None and at <= now]
    if due:
        at, first = min(due, key=lambda pair: pair[0])
        if at == first.step_at:  # the step's own deadline (it wins a tie with the run's)
            raise StepTimeout(f"Step {first.key!r} ran past its timeout "
                              f"(deadline {first.step_when:%Y-%m-%d %H:%M:%S.%f} UTC).")
        raise RunTimedOut()
    inner = _frames[-1]
    if inner.cancellable and inner.claim.cancel_sent_at is not None and not inner.claim.cancel_raised:
        inner.claim.cancel_raised = True
        raise Cancelled(f"The run was cancelled while step {inner.key!r} ran; the step was interrupted.")
    _arm()  # woken early (a cancel for a step that may not be interrupted): wait for the deadlines


def _arm() -> None:
    """Set the process timer to the earliest deadline of the running steps (or clear it)."""
    times = [t for f in _frames for t in (f.step_at, f.run_at) if t is not None]
    if times:
        signal.setitimer(signal.ITIMER_REAL, max(min(times) - time.monotonic(), 0.001))
    else:
        signal.setitimer(signal.ITIMER_REAL, 0)


class Alarm:
    """The alarm of one session (an advance or a branch): `alarm(deadline, key)` covers a step's code.

    The session gives the run's deadline (`deadline`) and its claim.
    """

    def __init__(self, session):
        self.session = session

    def __call__(self, deadline: dt.datetime | None, key: str, *, cancellable: bool = True) -> _Covered:
        return _Covered(self.session, deadline, key, cancellable)


class _Covered:
    """One step's code under its alarm: a context manager of its own (not a generator's), as it
    wraps every step and task."""

    __slots__ = ("session", "deadline", "key", "cancellable", "claim", "outer", "in_main", "timed")

    def __init__(self, session, deadline: dt.datetime | None, key: str, cancellable: bool):
        self.session, self.deadline, self.key, self.cancellable = session, deadline, key, cancellable

    def __enter__(self) -> None:
        global _previous_handler, _installed
        deadline = self.deadline
        claim = self.claim = self.session.claim
        run_deadline = self.session.deadline
        outer_deadline, outer_active = self.outer = claim.step_deadline, claim.step_active
        if deadline is None and run_deadline is None:  # most steps and tasks: nothing to time
            step_at = run_at = None
            ends: list[float] = []
        else:
            now = time.monotonic()
            step_at = now + max(claim.db_seconds_until(deadline), 0.001) if deadline is not None else None
            run_at = now + max(claim.db_seconds_until(run_deadline), 0.001) if run_deadline is not None else None
            ends = [t for t in (step_at, run_at) if t is not None]
            claim.step_deadline = min(ends + ([outer_deadline] if outer_deadline is not None else []))
        claim.step_active = self.cancellable and (outer_active if outer_active is not None else True)
        self.in_main = threading.get_ident() == threading.main_thread().ident  # (a call less than current_thread())
        if not self.in_main:
            return
        if ends and not _permanent and not _installed:
            # Outside a worker the handler is ours only while a timed step runs.
            _previous_handler, _installed = signal.signal(signal.SIGALRM, _on_alarm), True
        # Timed if this step is, or one it runs inside (no frame: nothing to look through).
        self.timed = bool(ends) or (bool(_frames) and any(f.step_at is not None or f.run_at is not None
                                                          for f in _frames))
        _frames.append(_Frame(self.key, claim, step_at, deadline, run_at, claim.step_active))
        if ends:
            try:
                _arm()
            except BaseException:  # an interrupt that came first: the step never starts
                self.__exit__()
                raise

    def __exit__(self, *exc) -> bool:
        global _previous_handler, _installed
        claim = self.claim
        if self.in_main:
            _frames.pop()
            if self.timed:  # a step with no deadline, under none, never touched the timer
                _arm()
            if not _frames and _installed:
                signal.signal(signal.SIGALRM, _previous_handler)
                _previous_handler, _installed = None, False
        claim.step_deadline, claim.step_active = self.outer
        return False
