"""A run's journal: one Step per checkpointed step, wait, child, branch group or recorded value."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from .. import serialization
from ..ids import EPOCH
from .base import DurableManager


class Step(models.Model):
    """One journal entry of a run: a checkpointed step and its recorded outcome."""

    class Kind(models.TextChoices):
        STEP = "step", "Step"
        NOTE = "note", "Recorded value"
        SLEEP = "sleep", "Sleep"
        SIGNAL = "signal", "Wait for a signal"
        EVENT = "event", "Wait for an event"
        PARALLEL = "parallel", "Parallel branches"
        CHILD = "child", "Child workflow"
        ROLLBACK = "rollback", "Compensation"
        SWITCH = "switch", "Branch taken"
        LOG = "log", "Note"
        PROGRESS = "progress", "Progress"
        EMIT = "emit", "Emitted event"
        PATCH = "patch", "Code change marker"
        APPROVAL = "approval", "Wait for an approval"
        STREAM = "stream", "Stream value"

    class Status(models.TextChoices):
        RUNNING = "running", "Running"
        RETRYING = "retrying", "Waiting to retry"
        WAITING = "waiting", "Waiting"
        COMPLETED = "completed", "Completed"
        FAILED = "failed", "Failed"
        PAUSED = "paused", "Paused for an operator"

    FINAL = frozenset({Status.COMPLETED, Status.FAILED})
    OPEN = frozenset({Status.RUNNING, Status.WAITING, Status.RETRYING})
    # Shown, never stored: an entry left running, waiting or retrying when its run ended (cancelled,
    # failed, timed out). Nothing waits or runs any more; a retry of the run picks it up as it was.
    STOPPED = "stopped"

    @classmethod
    def shown_status(cls, status: str, kind: str, run_finished: bool) -> str:
        """The entry's status as people read it: STOPPED for an open entry of a finished run."""
        if run_finished and status in cls.OPEN and kind != cls.Kind.PROGRESS:
            return cls.STOPPED
        return status

    # No index of its own: the unique (run, key) serves every lookup by run, and one index fewer is
    # one write fewer per checkpoint. No constraint in the database either (docs/decisions.md, "The
    # hot rows hang off their run without a constraint"): an entry is only written fenced by a claim
    # of its run, and Django's deletions still cascade. The constraint cost every checkpoint a
    # lookup and a lock of the run.
    run = models.ForeignKey("WorkflowRun", on_delete=models.CASCADE, related_name="steps", db_index=False,
                            db_constraint=False)
    key = models.CharField(max_length=255)
    seq = models.PositiveIntegerField()
    kind = models.CharField(max_length=20, choices=Kind.choices, default=Kind.STEP)
    name = models.CharField(
        max_length=255, blank=True, default="",
        help_text="The step's function, or the signal or event waited for.",
    )
    status = models.CharField(max_length=20, choices=Status.choices)
    result = models.TextField(null=True, blank=True)
    error = models.TextField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=1)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    deadline_at = models.DateTimeField(
        null=True, blank=True,
        help_text="When the running attempt times out, a sleep ends, or a wait gives up.",
    )
    retry_at = models.DateTimeField(null=True, blank=True, help_text="When the next attempt is due.")
    match = models.TextField(
        null=True, blank=True, help_text="JSON: the fields an awaited event must have."
    )
    remaining = models.IntegerField(
        null=True, blank=True, help_text="For a parallel group: branches not yet finished."
    )
    fingerprint = models.CharField(
        max_length=16, null=True, blank=True,
        help_text="A hash of the step's function and arguments: a replay that calls it otherwise is stopped.",
    )
    # The partition key where the journal is partitioned (PostgreSQL, partitioning.py): the run's
    # creation time, the same for every entry of a run. 1970 otherwise, and for the entries of the
    # runs created before the journal was partitioned (a default that costs no rewrite).
    run_created_at = models.DateTimeField(
        db_default=EPOCH, editable=False,
        help_text="Where the journal is partitioned: its run's creation time (its partition); 1970 otherwise.",
    )

    objects = DurableManager()

    class Meta:
        db_table = "durable_step"
        ordering = ["run", "seq"]
        constraints = [
            # At most one recorded outcome per step key: a second worker's checkpoint of the
            # same step fails here instead of recording twice.
            models.UniqueConstraint(fields=["run", "key"], name="durable_step_run_key"),
        ]
        indexes = [
            # emit_event() finds the runs waiting for an event by its name.
            models.Index(
                fields=["name"], condition=Q(kind="event", status="waiting"), name="durable_step_event_waits"
            ),
            # The stuck filter asks of each unfinished run whether it waits for something from
            # outside: only the open waits are in it (100 ms instead of 1 s at 10 million runs).
            models.Index(fields=["run"], condition=Q(status="waiting", kind__in=["signal", "event", "approval"]),
                         name="durable_step_open_waits"),
        ]

    def __str__(self) -> str:
        return f"{self.key} ({self.status})"

    def get_result(self):
        return serialization.decode(self.result)
