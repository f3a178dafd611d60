"""The service functions that the Python API, the admin, the REST API and the CLI all call.

The surfaces change a run only through these, which check its state (raising InvalidTransition,
RunFinished, ...) before they change it. The changes themselves are the workpool's transitions
(workpool/runs.py, workpool/endings.py, WorkflowRun.objects.back_to_pending()), which the
workers and the engine call too.
"""

from .control import cancel, duplicate, force_fail, fork, recover, release_claim, retry_rollback, retry_run, wake
from .messages import emit_event, signal
from .runs import (
    astart,
    await_result,
    create_run,
    get_run,
    resolve_run_id,
    runs_for,
    start,
    start_and_wait,
    start_many,
    start_run,
    wait,
    warn_if_unserved,
)
from .steps import edit_step_result, skip_step

__all__ = [
    "astart", "await_result", "cancel", "create_run", "duplicate", "edit_step_result", "fork", "emit_event", "force_fail", "get_run", "recover", "release_claim",
    "resolve_run_id", "retry_rollback", "retry_run", "runs_for", "signal", "skip_step", "start", "start_and_wait", "start_many", "start_run", "wait", "wake",
    "warn_if_unserved",
]
