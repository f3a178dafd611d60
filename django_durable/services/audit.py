"""The audit trail: what was done to a run from outside, by whom (WorkflowEvent rows)."""

from __future__ import annotations

from typing import Any

from ..models import WorkflowEvent


def record(run_id, type: str, *, by: str | None, message: str = "", data: dict[str, Any] | None = None,
           db: str) -> WorkflowEvent:
    """Add an entry to the run's trail, in the caller's transaction (the action and its record commit together)."""
    return WorkflowEvent.objects.using(db).create(
        run_id=run_id, type=type, actor=(by or "")[:200], message=message[:2000], data=data or {}
    )
