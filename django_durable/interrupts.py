"""Control flow between workflow code, the engine and the worker; never seen by users.

They derive from BaseException so that a workflow's ``except Exception:`` cannot swallow them.
"""

from __future__ import annotations


class Interrupt(BaseException):
    """Stop running the workflow function now."""


class Suspend(Interrupt):
    """The run waits for something (a timer, a signal, children); the worker moves on.

    `timers` are (kind, step key, fire at) to create, in the same transaction, to wake it;
    `items` are parallel branches to queue with it.
    """

    def __init__(self, waiting_on: str, timers=(), items=()):
        super().__init__(waiting_on)
        self.waiting_on = waiting_on
        self.timers = list(timers)
        self.items = list(items)  # (step key, function, input): parallel branches to queue


class Pause(Suspend):
    """A step failed for good under a policy that pauses (RetryPolicy(on_exhausted="pause")): the
    run is held ``paused`` for an operator, `waiting_on` saying why; nothing of it fails."""


class LeaseLost(Interrupt):
    """This worker no longer holds the claim: it must write nothing more for the run."""


class Preempted(Interrupt):
    """The worker is stopping: hand the run back at this checkpoint for another worker."""


class DatabaseUnavailable(Interrupt):
    """The engine's own write failed (connection lost, failover): not the workflow's fault."""


class RunTimedOut(Interrupt):
    """The run passed its deadline (the workflow's timeout): it ends timed_out."""


class CancelRequested(Interrupt):
    """The run was asked to cancel: it ends cancelled at this checkpoint."""


class CompensationFailed(Interrupt):
    """A compensation failed for good: the run ends compensation_failed."""

    def __init__(self, failure):
        super().__init__(str(failure))
        self.failure = failure
