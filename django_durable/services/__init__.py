"""The service functions that the Python API, the admin, the REST API and the CLI all call.

Nothing else changes a run's status: they enforce its state machine.
"""

from .control import cancel, retry_rollback
from .messages import emit_event, signal
from .runs import create_run, get_run, start, start_and_wait, wait

__all__ = [
    "cancel", "create_run", "emit_event", "get_run", "retry_rollback", "signal", "start", "start_and_wait", "wait",
]
