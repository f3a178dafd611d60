"""The exceptions django-durable raises; all derive from DurableError."""

from __future__ import annotations


class DurableError(Exception):
    """Base class of every error raised by django-durable."""


class WorkflowNotFound(DurableError, LookupError):
    """A workflow name is not registered, or a run id does not exist."""


class NotSerializable(DurableError, TypeError):
    """A value cannot be stored: it is not JSON with the supported extra types."""


class PayloadTooLarge(DurableError, ValueError):
    """An encoded payload is larger than DURABLE_MAX_PAYLOAD_BYTES."""


class NonDeterminismError(DurableError):
    """Replay reached a recorded step with a different kind or function than was recorded."""


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
    """A step raised and will not be retried; carries the original type, message and traceback."""

    def __init__(self, key: str, error: dict):
        self.key = key
        self.error = error
        self.type = error.get("type", "")
        self.message = error.get("message", "")
        self.traceback = error.get("traceback", "")
        super().__init__(f"Step {key!r} failed: {self.type}: {self.message}")


class WaitTimeout(DurableError, TimeoutError):
    """wait() gave up before the run finished; the run itself goes on."""
