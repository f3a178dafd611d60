"""Control flow between workflow code, the engine and the worker; never seen by users.

They derive from BaseException so that a workflow's ``except Exception:`` cannot swallow them.
"""

from __future__ import annotations


class Interrupt(BaseException):
    """Stop running the workflow function now."""


class Suspend(Interrupt):
    """The run waits for something (a timer, a signal, children); the worker moves on."""

    def __init__(self, waiting_on: str):
        super().__init__(waiting_on)
        self.waiting_on = waiting_on


class LeaseLost(Interrupt):
    """This worker no longer holds the claim: it must write nothing more for the run."""


class Preempted(Interrupt):
    """The worker is stopping: hand the run back at this checkpoint for another worker."""


class DatabaseUnavailable(Interrupt):
    """The engine's own write failed (connection lost, failover): not the workflow's fault."""
