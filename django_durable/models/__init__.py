"""The durable tables: workflow runs, their step journal, the workpool and timers.

One module per concern, each importing only those below it: base.py (the manager), stored.py (the
payload store's rows, below serialization), journal.py (steps), pool.py (work items and their
verbs, timers), messages.py (signals and events), runs.py (runs and their verbs), operators.py
(approvals, schedules, the audit trail, workers, the admin's proxies).
"""

from ..ids import EPOCH, uuid7  # noqa: F401 - migration 0001 names models.uuid7
from .base import DurableManager
from .journal import Step
from .messages import SignalMessage, StoredEvent
from .operators import Approval, ApprovalDecision, Definition, Overview, Schedule, Worker, WorkflowEvent
from .pool import FairTurn, QueueChange, QueueControl, QueueState, StartGate, Timer, WorkItem, WorkItemQuerySet
from .runs import IdTimeField, SubjectRelation, WorkflowRun, WorkflowRunQuerySet
from .stored import StoredPayload

__all__ = [
    "Approval", "ApprovalDecision", "Definition", "DurableManager", "FairTurn", "IdTimeField", "Overview", "QueueChange", "QueueControl", "QueueState",
    "StartGate", "Schedule", "SignalMessage", "Step", "StoredEvent", "StoredPayload", "SubjectRelation", "Timer", "Worker",
    "WorkflowEvent", "WorkflowRun", "WorkflowRunQuerySet", "WorkItem", "WorkItemQuerySet",
]
