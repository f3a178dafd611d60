"""The exceptions django-durable raises; all derive from DurableError."""

from __future__ import annotations


class DurableError(Exception):
    """Base class of every error raised by django-durable."""


# What a step's, a branch's, a task's or a workflow's own code raises that is its failure: any
# Exception, and SystemExit or KeyboardInterrupt (sys.exit(), exit(), a raise of its own). A worker
# never raises these itself (its signal handlers only set flags), so they come from the code, and
# fail the attempt they ended, recorded as what they are, instead of stopping the worker.
CODE_FAILURES = (Exception, SystemExit, KeyboardInterrupt)


class WorkflowNotFound(DurableError, LookupError):
    """A workflow name is not registered, or a run id does not exist."""


class NotSerializable(DurableError, TypeError):
    """A value cannot be stored: it is not JSON with the supported extra types."""


class InvalidArguments(DurableError, TypeError):
    """A run was started with arguments its workflow function does not take (nothing was stored).

    `argument` names the first keyword argument it does not take, when that is the problem.
    """

    def __init__(self, message: str, argument: str | None = None):
        super().__init__(message)
        self.argument = argument


class InvalidInput(InvalidArguments):
    """A run's input failed the validation its workflow declares (``input=``); nothing was stored.

    `errors` maps each field (or "input") to its messages, as a DRF serializer's errors do.
    """

    def __init__(self, message: str, errors: dict[str, list[str]]):
        super().__init__(message, argument=next(iter(errors), None))
        self.errors = errors


class PayloadTooLarge(DurableError, ValueError):
    """An encoded payload is larger than DURABLE_MAX_PAYLOAD_BYTES."""


class NonDeterminismError(DurableError):
    """Replay reached a recorded step with a different kind or function than was recorded."""


class NoBranchMatched(DurableError, ValueError):
    """ctx.switch() found no branch for its value and has no default."""


class WorkflowFailed(DurableError):
    """The run ended failed; raised by wait() with the run's recorded error."""

    def __init__(self, run_id, status: str, error: dict | None):
        self.run_id = run_id
        self.status = status
        self.error = error or {}
        kind = self.error.get("type", "")
        message = self.error.get("message", "")
        detail = f"{kind}: {message}" if kind else message
        super().__init__(f"Workflow run {run_id} ended {status}" + (f": {detail}" if detail else "."))


class StepFailed(DurableError):
    """A step failed for good (its attempts ran out, or it was not retryable).

    Carries the original exception's `type` (a dotted name), `message` and `traceback`, and the
    number of `attempts` made.
    """

    def __init__(self, key: str, error: dict, attempts: int = 1):
        self.key = key
        self.error = error
        self.attempts = attempts
        self.type = error.get("type", "")
        self.message = error.get("message", "")
        self.traceback = error.get("traceback", "")
        tries = f" after {attempts} attempts" if attempts > 1 else ""
        super().__init__(f"Step {key!r} failed{tries}: {self.type}: {self.message}")


class NonRetryableError(DurableError):
    """Raise it in a step to fail the step at once, whatever its retry policy."""


class OtherDatabase(NonRetryableError):
    """The durable tables are on another database (DURABLE_DATABASE) than a transaction that relies
    on them: a start inside a transaction of another database, or an ``atomic=True`` step writing to
    another database. Neither could commit or roll back with the durable write, so it is refused."""


class RetryAfter(DurableError):
    """Raise it in a step to be tried again after `seconds` (a rate limit's Retry-After).

    It still counts as an attempt: when the attempts run out, the step fails.
    """

    def __init__(self, seconds, message: str = ""):
        from .clock import seconds as in_seconds

        self.seconds = in_seconds(seconds, "RetryAfter's delay")
        super().__init__(message or f"Retry after {self.seconds:g} seconds.")


class StepTimeout(DurableError, TimeoutError):
    """A step ran past its timeout; it counts as a failed attempt."""


class WorkflowTimeout(DurableError, TimeoutError):
    """A run passed its deadline (the workflow's timeout) and ended timed_out."""


class WaitTimeout(DurableError, TimeoutError):
    """wait() gave up before the run finished; the run itself goes on (`run_id` names it). `hint`:
    why it may never finish (no worker serves its queue), or None."""

    def __init__(self, message: str, run_id=None, hint: str | None = None):
        super().__init__(message)
        self.run_id, self.hint = run_id, hint


class RunFinished(DurableError):
    """The run already ended, so it cannot take this signal or be cancelled."""

    def __init__(self, run_id, status: str):
        self.run_id = run_id
        self.status = status
        super().__init__(f"Workflow run {run_id} already ended {status}.")


class SignalTimeout(DurableError, TimeoutError):
    """wait_for_signal() or wait_for_event() gave up: nothing arrived before its timeout."""


class ApprovalTimeout(SignalTimeout):
    """Nobody settled a ``ctx.wait_for_approval()`` before its timeout."""


class SubjectBusy(DurableError):
    """A one_at_a_time workflow already has an unfinished run for this subject; `run_id` names it."""

    def __init__(self, message: str, run_id=None):
        super().__init__(message)
        self.run_id = run_id


class UpdateRejected(DurableError):
    """The workflow refused an update (update.reject(reason)); `reason` says why."""

    def __init__(self, message: str, reason: str = "", update_id: str | None = None):
        super().__init__(message)
        self.reason, self.update_id = reason, update_id


class SingletonBusy(SubjectBusy):
    """start(..., singleton=key) of a workflow declared singleton_busy="refuse" while a run with that
    key is unfinished; `run_id` names that run."""


class Cancelled(DurableError):
    """The run was cancelled (recorded as its error, with the reason given)."""


class ChildFailed(DurableError):
    """A child workflow run did not complete: it failed, timed out or was cancelled.

    `status` and `error` are the child's; `type` and `message` those of its error.
    """

    def __init__(self, run_id, error: dict):
        self.run_id = run_id
        self.error = error
        self.status = error.get("status", "failed")
        self.type = error.get("type", "")
        self.message = error.get("message", "")
        super().__init__(f"Child workflow run {run_id} ended {self.status}: {self.type}: {self.message}")


class InvalidTransition(DurableError):
    """The run's status does not allow this operation."""


class ForcedFailure(DurableError):
    """An operator forced the run to fail (recorded as its error, with the reason given)."""


class StepNotFound(DurableError, LookupError):
    """The run has no journal entry with this key."""
