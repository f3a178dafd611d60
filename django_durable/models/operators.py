"""What operators and code do around runs: approvals and their decisions, schedules, the audit
trail, the workers' own rows, and the admin's pages that hang on the runs table."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from .. import cron
from .base import DurableManager
from .runs import WorkflowRun


class Approval(models.Model):
    """A decision a run waits for (``ctx.wait_for_approval()``), and who may make it.

    Who may decide is one of: holders of a permission (``"app.codename"``, as ``user.has_perm``
    answers it, so superusers too), members of a group, or listed users. `quorum` different
    users must approve; one rejection rejects. The run is told by a message (kind "approval")
    sent in the transaction of the deciding decision.
    """

    class Status(models.TextChoices):
        PENDING = "pending", "Waiting for a decision"
        APPROVED = "approved", "Approved"
        REJECTED = "rejected", "Rejected"

    run = models.ForeignKey(WorkflowRun, on_delete=models.CASCADE, related_name="approvals")
    key = models.CharField(max_length=255, help_text="The wait's key in the run.")
    permission = models.CharField(max_length=255, blank=True, default="", help_text="app_label.codename")
    group = models.CharField(max_length=150, blank=True, default="")
    users = models.JSONField(default=list, blank=True, help_text="The primary keys of the users who may decide.")
    quorum = models.PositiveSmallIntegerField(default=1)
    message = models.TextField(blank=True, default="", help_text="What the approvers are asked.")
    data = models.JSONField(default=dict, blank=True, help_text="The context shown with the question.")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    created_at = models.DateTimeField(db_default=Now())
    deadline_at = models.DateTimeField(null=True, blank=True, help_text="When the wait gives up.")
    decided_at = models.DateTimeField(null=True, blank=True)

    objects = DurableManager()

    class Meta:
        db_table = "durable_approval"
        ordering = ["-created_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["run", "key"], name="durable_approval_run_key")]
        indexes = [models.Index(fields=["status", "created_at"], name="durable_approval_open")]

    def __str__(self) -> str:
        return f"{self.key} of {self.run_id} ({self.status})"

    @property
    def approvers(self) -> str:
        """Who may decide, as a person reads it."""
        if self.permission:
            return f"users with the permission {self.permission}"
        if self.group:
            return f"members of the group {self.group}"
        return f"{len(self.users)} named user(s)"


class ApprovalDecision(models.Model):
    """One user's decision on an approval (at most one each)."""

    approval = models.ForeignKey(Approval, on_delete=models.CASCADE, related_name="decisions")
    # Like subject_type: the users may be on another database; deleting one nulls this (subjects.py).
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.DO_NOTHING, db_constraint=False,
                             related_name="+")
    username = models.CharField(max_length=150, help_text="Kept when the user is deleted.")
    approved = models.BooleanField()
    comment = models.TextField(blank=True, default="")
    at = models.DateTimeField(db_default=Now())
    link = models.CharField(max_length=64, null=True, blank=True, help_text="The e-mailed link it came by.")

    objects = DurableManager()

    class Meta:
        db_table = "durable_approval_decision"
        ordering = ["approval", "at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["approval", "user"], name="durable_approval_one_per_user"),
            # An e-mailed link decides once.
            models.UniqueConstraint(fields=["link"], condition=Q(link__isnull=False), name="durable_approval_link_once"),
        ]

    def __str__(self) -> str:
        return f"{'approved' if self.approved else 'rejected'} by {self.username}"


class Schedule(models.Model):
    """A recurring start of a workflow: by a cron expression or at a fixed interval."""

    class Status(models.TextChoices):
        ACTIVE = "active", "Active"
        PAUSED = "paused", "Paused"

    class Overlap(models.TextChoices):
        ALLOW = "allow", "Start even if the previous run is unfinished"
        SKIP = "skip", "Skip while the previous run is unfinished"

    class CatchUp(models.TextChoices):
        NONE = "none", "Skip missed fire times"
        LATEST = "latest", "Run the latest missed fire time"
        ALL = "all", "Run every missed fire time"

    slug = models.SlugField(max_length=100, unique=True)
    workflow = models.CharField(max_length=200)
    args = models.TextField(default="[]", help_text="JSON.")
    kwargs = models.TextField(default="{}", help_text="JSON.")
    cron = models.CharField(max_length=200, blank=True, default="")
    interval = models.FloatField(null=True, blank=True, help_text="Seconds between fire times.")
    timezone = models.CharField(max_length=64, default="UTC")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.ACTIVE)
    overlap = models.CharField(max_length=10, choices=Overlap.choices, default=Overlap.ALLOW)
    catch_up = models.CharField(max_length=10, choices=CatchUp.choices, default=CatchUp.NONE)
    queue = models.CharField(max_length=100, blank=True, default="")
    declared = models.BooleanField(default=False, help_text="Declared on the workflow with schedule=.")
    next_fire_at = models.DateTimeField(null=True, blank=True)
    last_fire_at = models.DateTimeField(null=True, blank=True)
    last_run = models.ForeignKey(
        WorkflowRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    objects = DurableManager()

    class Meta:
        db_table = "durable_schedule"
        ordering = ["slug"]
        permissions = [("trigger_schedule", "Can start a schedule's workflow now")]
        indexes = [
            # The scheduler's path: active schedules by their next fire time.
            models.Index(fields=["next_fire_at"], condition=Q(status="active"), name="durable_schedule_due"),
        ]

    def __str__(self) -> str:
        return f"{self.slug} ({self.cron or f'every {self.interval:g} s'})"

    def next_runs(self, count: int = 5) -> list:
        """The next `count` fire times (aware datetimes in the schedule's time zone)."""
        return cron.upcoming(self, count)


class WorkflowEvent(models.Model):
    """One entry of a run's audit trail: something done to the run from outside, by whom, when.

    The engine's own history is the journal (steps with their times and attempts); this trail
    holds what operators and code did to a run: starts from the admin, cancels, retries,
    skipped and edited steps, signals sent by hand, timers fired early, and the engine holding
    it for an operator when its code changed (blocked).
    """

    class Type(models.TextChoices):
        STARTED = "started", "Started"
        DUPLICATED = "duplicated", "Duplicated"
        FORKED = "forked", "Forked"
        CANCELLED = "cancelled", "Cancel requested"
        RETRIED = "retried", "Retried from the last checkpoint"
        FORCE_FAILED = "force_failed", "Forced to fail"
        STEP_SKIPPED = "step_skipped", "Step skipped"
        STEP_EDITED = "step_edited", "Step result edited"
        ROLLBACK_RETRIED = "rollback_retried", "Rollback retried"
        SIGNAL_SENT = "signal_sent", "Signal sent"
        WOKEN = "woken", "Timer fired early"
        CLAIM_RELEASED = "claim_released", "Claim released"
        ATTEMPT_ENDED = "attempt_ended", "Attempt ended"
        WORKER_LOST = "worker_lost", "Worker lost; delivered again"
        RECOVERED = "recovered", "Advance given back"
        BLOCKED = "blocked", "Blocked: the code changed"
        PAUSED = "paused", "Paused: a step's attempts ran out"
        APPROVED = "approved", "Approved"
        REJECTED = "rejected", "Rejected"

    # The events recorded when something other than its holder takes a run's item from a worker:
    # the reaper (a lapsed lease, a worker declared dead), an operator's release, a forced failure.
    TAKES_CLAIM = (Type.WORKER_LOST, Type.CLAIM_RELEASED, Type.FORCE_FAILED)

    run = models.ForeignKey(WorkflowRun, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(db_default=Now())
    type = models.CharField(max_length=30, choices=Type.choices)
    actor = models.CharField(
        max_length=200, blank=True, default="", help_text="Who did it: a user name, or empty for code."
    )
    message = models.TextField(blank=True, default="")
    data = models.JSONField(default=dict, blank=True)

    objects = DurableManager()

    class Meta:
        db_table = "durable_workflow_event"
        ordering = ["run", "at", "id"]
        indexes = [models.Index(fields=["run", "at"], name="durable_event_run")]
        # Not "workflow events": the sidebar lists "Emitted events" (events for waiting runs) too.
        verbose_name = "audit trail entry"
        verbose_name_plural = "audit trail"

    def __str__(self) -> str:
        return f"{self.get_type_display()} by {self.actor or 'code'}"

    @classmethod
    def record(cls, run_id, type: str, *, by: str | None, message: str = "", data: dict[str, Any] | None = None,
               db: str) -> WorkflowEvent:
        """Add an entry to the run's trail, in the caller's transaction (the action and its record
        commit together); `by` names who acted (None: code)."""
        return cls.objects.using(db).create(
            run_id=run_id, type=type, actor=(by or "")[:200], message=message[:2000], data=data or {}
        )


class Worker(models.Model):
    """A worker process, as it last reported itself (its maintenance thread writes this row)."""

    name = models.CharField(max_length=200, unique=True)
    host = models.CharField(max_length=200)
    pid = models.PositiveIntegerField()
    machine = models.CharField(max_length=100, blank=True, default="", help_text=(
        "The kernel's boot id and the pid namespace: a worker that shares them can tell this one's process is gone."))
    queues = models.CharField(max_length=500, blank=True, default="", help_text="Empty: every queue.")
    started_at = models.DateTimeField()
    last_seen = models.DateTimeField()
    stopped_at = models.DateTimeField(null=True, blank=True)
    processed = models.PositiveBigIntegerField(default=0, help_text="Work items it finished.")
    current = models.CharField(max_length=300, blank=True, default="", help_text="What it is doing now.")

    objects = DurableManager()

    class Meta:
        db_table = "durable_worker"
        ordering = ["-last_seen"]

    def __str__(self) -> str:
        return self.name


class Overview(WorkflowRun):
    """No table of its own: the admin's overview page (counts, queue lag, throughput) hangs on it."""

    class Meta:
        proxy = True
        verbose_name = "overview"
        verbose_name_plural = "overview"
        default_permissions = ()  # seeing runs is enough (view_workflowrun)


class Definition(WorkflowRun):
    """No table of its own: the admin's page of the registered workflows and tasks hangs on it."""

    class Meta:
        proxy = True
        verbose_name = "workflow definition"
        verbose_name_plural = "workflow definitions"
        default_permissions = ()  # seeing runs is enough (view_workflowrun)
