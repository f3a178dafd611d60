"""Interrupting a step that runs past its deadline, or past its run's deadline."""

from __future__ import annotations

import signal
import threading
import time
from contextlib import contextmanager

from ..exceptions import StepTimeout
from ..interrupts import RunTimedOut


class Alarm:
    """Raises in a step when its deadline (or its run's) passes.

    SIGALRM interrupts Python code and blocking system calls in the main thread: the step sees
    StepTimeout (or the run ends timed_out). Code that swallows it or never returns to Python is
    caught by the worker's watchdog, which replaces the whole process once `claim.step_deadline`
    is well past (DURABLE_STEP_KILL_GRACE_SECONDS). Outside the main thread only the watchdog
    applies.
    """

    def __init__(self, session):
        self.session = session

    @contextmanager
    def __call__(self, deadline, key: str):
        run_deadline = self.session.deadline
        candidates = [d for d in (deadline, run_deadline) if d is not None]
        if not candidates:
            yield
            return
        when = min(candidates)
        seconds = max(self.session.remaining(when), 0.001)
        step_first = deadline is not None and (run_deadline is None or deadline <= run_deadline)

        def on_alarm(signum, frame):
            if step_first:
                raise StepTimeout(f"Step {key!r} ran past its timeout (deadline {when:%Y-%m-%d %H:%M:%S.%f} UTC).")
            raise RunTimedOut()

        claim = self.session.claim
        claim.step_deadline = time.monotonic() + seconds
        in_main = threading.current_thread() is threading.main_thread()
        previous = None
        if in_main:
            previous = signal.signal(signal.SIGALRM, on_alarm)
            signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            yield
        finally:
            if in_main:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous)
            claim.step_deadline = None
