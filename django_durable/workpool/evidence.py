"""The evidence of earlier attempts: what a retry would otherwise erase.

A step's error keeps the errors of its earlier attempts itself (serialization.dumps_error). A
run's error and its failed steps are erased when the run goes again (an automatic retry of
the run, an operator's retry); before that, `keep()` copies them into an "attempt ended" entry
of the run's audit trail, in the same transaction. `history()` reads every attempt's error
back, oldest first, for the admin and the API.
"""

from __future__ import annotations

from .. import serialization
from ..models import Step, WorkflowEvent, WorkflowRun

TRACEBACK_CHARS = 5_000


def keep(run_id, *, attempt: int, status: str, error: str | None, finished_at=None, worker: str = "",
         db: str) -> None:
    """Copy the ending attempt's error and its failed steps' errors into the audit trail (the
    entry's time is when the attempt ended, unless `finished_at` says it ended earlier; `worker`
    is the worker that ran it, when known)."""
    steps = [
        {"key": key, "attempts": attempts, "errors": serialization.error_history(text)}
        for key, attempts, text in Step.objects.using(db).filter(run_id=run_id, status=Step.Status.FAILED)
        .exclude(error=None).order_by("seq").values_list("key", "attempts", "error")[:100]
    ]
    parts = serialization.error_parts(error, limit=serialization.MAX_MESSAGE_CHARS)
    if parts is not None:
        decoded = _decoded(error)
        parts["traceback"] = str(decoded.get("traceback", ""))[-TRACEBACK_CHARS:]
    WorkflowEvent.objects.using(db).create(
        run_id=run_id, type=WorkflowEvent.Type.ATTEMPT_ENDED, message=f"Attempt {attempt} ended {status}",
        data={"attempt": attempt, "status": status, "finished_at": finished_at.isoformat() if finished_at else None,
              "error": parts, "steps": steps, **({"worker": worker} if worker else {})},
    )


def history(run: WorkflowRun, *, db: str) -> list[dict]:
    """Every error of every attempt of the run and its steps, oldest first.

    Each entry: {"attempt": the run's attempt, "step": a step key or None, "step_attempt":
    the step's attempt or None, "type", "message", "current": whether it belongs to the run's
    present attempt}.
    """
    entries = []
    ended = WorkflowEvent.objects.using(db).filter(run=run, type=WorkflowEvent.Type.ATTEMPT_ENDED).order_by("at", "id")
    for data in ended.values_list("data", flat=True)[:200]:
        attempt = data.get("attempt")
        for step in data.get("steps") or []:
            entries += _step_entries(attempt, step["key"], step.get("errors") or [], current=False)
        if data.get("error"):
            entries.append(_entry(attempt, None, None, data["error"], current=False))
    for key, text in Step.objects.using(db).filter(run=run).exclude(error=None).order_by("seq") \
            .values_list("key", "error")[:1000]:
        entries += _step_entries(run.attempt, key, serialization.error_history(text), current=True)
    if run.error and run.is_finished:  # an unfinished run's error is its last attempt's, kept above
        entries += [_entry(run.attempt, None, None, error, current=True)
                    for error in serialization.error_history(run.error)[-1:]]
    return entries


def _step_entries(attempt, key, errors, *, current):
    return [_entry(attempt, key, error.get("attempt"), error, current=current) for error in errors]


def _entry(attempt, key, step_attempt, error: dict, *, current: bool) -> dict:
    return {"attempt": attempt, "step": key, "step_attempt": step_attempt, "type": str(error.get("type", "")),
            "message": str(error.get("message", ""))[:1000], "current": current}


def _decoded(text: str) -> dict:
    try:
        value = serialization.decode(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
