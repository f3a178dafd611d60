"""The operator dashboard in the Django admin.

Runs (list, detail with journal and timeline, actions), an overview page, schedules, work
items, timers, workers and the audit trail. Status, lease and journal fields are never edited
here: every change goes through the service functions, behind its own permission.
"""

from . import approvals, definitions, overview, pool, runs, schedules  # noqa: F401 - registering the ModelAdmins
from .subjects import DurableRunsInline, DurableSubjectAdmin

__all__ = ["DurableRunsInline", "DurableSubjectAdmin"]
