"""Workflow runs: the run, its QuerySet verbs, and what a run is about (its subject)."""

from __future__ import annotations

import re

from django.contrib.contenttypes.fields import GenericForeignKey
from django.db import models
from django.db.models import Exists, F, OuterRef, Q
from django.db.models.functions import Coalesce, Now

from .. import clock, conf, serialization
from ..humanize import short_id
from ..ids import EPOCH, uuid7
from ..partitioning import keys
from .base import DurableManager
from .journal import Step
from .pool import Timer, WorkItem


class SubjectRelation(GenericForeignKey):
    """A run's subject (start(..., subject=row)), read on the row's own database, not the run's:
    with DURABLE_DATABASE apart, the durable database has neither the content types nor the rows.
    None without one, or once the row is deleted (subject_label still names it)."""

    def __get__(self, instance, cls=None):
        if instance is None:
            return self
        if self.is_cached(instance):
            return self.get_cached_value(instance)
        subject = None
        if instance.subject_type_id is not None:
            from django.contrib.contenttypes.models import ContentType

            model = ContentType.objects.get_for_id(instance.subject_type_id).model_class()
            if model is not None:
                subject = model._default_manager.filter(pk=instance.subject_id).first()
        self.set_cached_value(instance, subject)
        return subject


class IdTimeField(models.DateTimeField):
    """WorkflowRun.id_time: filled in from the run's id when the row is inserted (ids.id_time), so
    that every way of making a run (the ORM, bulk_create, an import) puts it in its partition."""

    def pre_save(self, model_instance, add):
        if add:
            value = keys.key(model_instance.pk, model_instance._state.db or conf.get("DATABASE"))
            setattr(model_instance, self.attname, value)
            return value
        return super().pre_save(model_instance, add)

    def deconstruct(self):
        # Migrations name it where it was first defined, which the models package still exports.
        name, _, args, kwargs = super().deconstruct()
        return name, "django_durable.models.IdTimeField", args, kwargs


def claimed_values(worker: str, claimed_at) -> dict:
    """What a worker's claim of a run's advance writes of itself, made at `claimed_at` (a time or
    an expression on the database's clock): every column of WorkflowRun.CLAIMED_COLUMNS (in SQL
    queries.claimed_by). The run's start is its first claim's."""
    return {"started_at": Coalesce(F("started_at"), claimed_at), "last_worker": worker,
            "last_claimed_at": claimed_at}


class WorkflowRunQuerySet(models.QuerySet):
    def filter(self, *args, **kwargs):
        """QuerySet.filter(); where runs are partitioned, a lookup by id (pk=, pk__in=) also names
        the partitions of those ids, so that it reads them and not every one (partitioning/keys.py)."""
        return super().filter(*args, **kwargs, **keys.lookup(self.db, kwargs))

    def unfinished(self):
        return self.exclude(status__in=WorkflowRun.TERMINAL)

    def finished(self):
        return self.filter(status__in=WorkflowRun.TERMINAL)

    def of_kind(self, kind: str):
        """Runs of workflows ("workflow") or of django.tasks tasks ("task"), as the registry of
        this process knows them; ValueError for another kind."""
        from .. import registry

        if kind not in ("workflow", "task"):
            raise ValueError(f"Not a kind: {kind[:50]!r}; use workflow or task.")
        tasks = [d.name for d in registry.definitions() if d.kind == "task"]
        return self.filter(workflow__in=tasks) if kind == "task" else self.exclude(workflow__in=tasks)

    def waiting_for(self, kind: str):
        """Unfinished runs waiting for `kind` (WorkflowRun.WAITING_FOR); ValueError for another."""
        prefixes = WorkflowRun.WAITING_FOR.get(kind)
        if prefixes is None:
            raise ValueError(f"Not a kind of wait: {kind[:50]!r}; use {', '.join(WorkflowRun.WAITING_FOR)}.")
        condition = Q()
        for prefix in prefixes:
            condition |= Q(waiting_on__startswith=prefix)
        # Named statuses, not "not terminal": the planner starts from the few unfinished runs on the
        # status index instead of walking every run in creation order (1.4 s at 10 million runs).
        return self.filter(status__in=sorted(WorkflowRun.UNFINISHED)).filter(condition)

    def stuck(self, *, lease_expired: bool = True, nothing_pending: bool = True):
        """Unfinished runs whose worker's lease expired, or that nothing will ever advance.

        Nothing will advance a run that has no queued or claimed work item, no pending timer, no
        wait for a signal or event (those come from outside), and no unfinished child.
        """
        run = OuterRef("pk")
        expired = Exists(WorkItem.objects.filter(run=run, status=WorkItem.Status.PROCESSING,
                                                 claim_expires_at__lt=clock.db_now()))
        waits = Step.objects.filter(run=run, status=Step.Status.WAITING,
                                    kind__in=[Step.Kind.SIGNAL, Step.Kind.EVENT, Step.Kind.APPROVAL])
        children = WorkflowRun.objects.filter(parent=run).exclude(status__in=WorkflowRun.TERMINAL)
        # Where the journal or the runs are partitioned, each run's lookup names its partitions (its
        # entries carry its creation time, or 1970 from before the conversion; its children carry its
        # id's time): else it reads every partition's index, for every unfinished run (2.9 s at 10M).
        # (On a plain journal every entry's key is 1970: the condition holds, and costs nothing.)
        waits = waits.filter(Q(run_created_at=OuterRef("created_at")) | Q(run_created_at=EPOCH))
        if keys.layout(self.db) is not None:
            children = children.filter(id_time=OuterRef("id_time"))
        idle = (
            ~Exists(WorkItem.objects.filter(run=run, status__in=[WorkItem.Status.PENDING, WorkItem.Status.PROCESSING]))
            & ~Exists(Timer.objects.filter(run=run, status=Timer.Status.PENDING))
            & ~Exists(waits)
            & ~Exists(children)
        )
        if lease_expired and nothing_pending:
            condition = expired | idle
        elif lease_expired:
            condition = expired
        else:
            condition = idle
        # Named statuses rather than "not terminal": the planner then starts from the few unfinished
        # runs on the status index instead of walking the whole table.
        # A blocked or paused run is held for an operator on purpose (durable.retry_run() resumes it).
        unfinished = [status for status in WorkflowRun.Status.values
                      if status not in WorkflowRun.TERMINAL and status not in WorkflowRun.HELD]
        return self.filter(status__in=unfinished).filter(condition)

    def mark_running(self, worker: str, claimed_at=None) -> int:
        """These unfinished runs are being advanced by `worker` now, under a claim made at
        `claimed_at` (default: now): every column of WorkflowRun.RUNNING_COLUMNS (in SQL
        queries.mark_running). Return how many."""
        now = clock.db_now()
        return self.unfinished().update(status=WorkflowRun.Status.RUNNING, updated_at=now, waiting_on="",
                                        **claimed_values(worker, now if claimed_at is None else claimed_at))

    def end(self, status: str, *, result: str | None, error: str | None, **fields) -> int:
        """End these runs with `status`, writing every column of WorkflowRun.END_COLUMNS (`result`
        and `error` as given: None clears one); `fields` are set with them. Return how many.
        endings.record_end() is the one caller, with everything an end drags along."""
        now = clock.db_now()
        values = {"status": status, "result": result, "error": error, "waiting_on": "", "finished_at": now,
                  "updated_at": now}
        return self.update(**values, **fields)

    def back_to_pending(self, *, waiting_on: str = "", from_statuses=None, **fields) -> int:
        """These runs wait for their next advance (``pending``); return how many moved.

        The one way a run goes back to pending: by default a run a worker was advancing, whose
        item was freed (a lost lease, a released claim, code the worker lacks); `from_statuses`
        names others (a blocked run resumed, a finished run restarted), `waiting_on` says what it
        waits for, and `fields` are set with it (what a restart resets). The caller makes its
        advance item ready (WorkItemQuerySet.requeue, end) in the same transaction; the
        PostgreSQL twin is queries.RELEASE (a worker handing its run back).
        """
        statuses = (WorkflowRun.Status.RUNNING,) if from_statuses is None else tuple(from_statuses)
        return self.filter(status__in=statuses).update(
            status=WorkflowRun.Status.PENDING, waiting_on=waiting_on, updated_at=clock.db_now(), **fields
        )


class WorkflowRun(models.Model):
    """One execution of a workflow."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        RUNNING = "running", "Running"
        WAITING = "waiting", "Waiting"
        COMPLETED = "completed", "Completed"
        FAILED = "failed", "Failed"
        CANCELLED = "cancelled", "Cancelled"
        TIMED_OUT = "timed_out", "Timed out"
        COMPENSATION_FAILED = "compensation_failed", "Compensation failed"
        BLOCKED = "blocked", "Blocked: the code changed"
        PAUSED = "paused", "Paused: a step's attempts ran out"

    TERMINAL = frozenset(
        {Status.COMPLETED, Status.FAILED, Status.CANCELLED, Status.TIMED_OUT, Status.COMPENSATION_FAILED}
    )
    # Unfinished, held for an operator: retry_run() resumes them.
    HELD = frozenset({Status.BLOCKED, Status.PAUSED})
    UNFINISHED = frozenset(Status.values) - TERMINAL
    # The kinds of wait, by how the engine starts `waiting_on` for each (the admin and the API
    # filter on them: ?waiting_for=signal).
    WAITING_FOR = {
        "sleep": ("sleep ",),
        "retry": ("retry of ",),
        "signal": ("signal ",),
        "event": ("event ",),
        "approval": ("approval ",),
        "children": ("parallel ", "child workflow "),
        "start": ("starts at ",),
        "code": ("a worker that has ", "a fix of the code"),
        "operator": ("an operator",),
    }

    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    workflow = models.CharField(max_length=200, help_text="The registered workflow name.")
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PENDING)
    waiting_on = models.CharField(max_length=500, blank=True, default="")
    input = models.TextField(default="{}", help_text="JSON: the args and kwargs of the run.")
    result = models.TextField(null=True, blank=True, help_text="JSON: what the workflow returned.")
    error = models.TextField(null=True, blank=True, help_text="JSON: type, message and traceback.")
    attempt = models.PositiveIntegerField(default=1)
    max_attempts = models.PositiveIntegerField(default=1)
    queue = models.CharField(max_length=100, default="default")
    priority = models.IntegerField(default=0)
    parent = models.ForeignKey(
        # Deleting a finished parent must not take an unfinished child with it. Indexed for the
        # children only (durable_run_children): most runs have no parent.
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children", db_index=False
    )
    detached = models.BooleanField(
        default=False, db_default=False, help_text="A child started detached: it goes on when its parent ends otherwise than completed."
    )
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)
    concurrency_key = models.CharField(
        max_length=200, blank=True, default="", db_default="",
        help_text="Runs of one key share their queue's key_concurrency (DURABLE_QUEUES), e.g. a tenant.",
    )
    awaited = models.BooleanField(
        default=False, db_default=False, editable=False,
        help_text="Someone waits for its result (durable.wait on PostgreSQL): its end is announced by NOTIFY.",
    )
    last_worker = models.CharField(
        max_length=200, blank=True, default="", db_default="", editable=False,
        help_text="The worker that last claimed the run to advance it.",
    )
    last_claimed_at = models.DateTimeField(null=True, blank=True, editable=False,
                                           help_text="When a worker last claimed the run to advance it.")
    deadline_at = models.DateTimeField(null=True, blank=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    scheduled_at = models.DateTimeField(
        null=True, blank=True, help_text="When the run was due to start: a delayed start or a schedule's fire time."
    )
    created_at = models.DateTimeField(db_default=Now())
    started_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(db_default=Now())
    finished_at = models.DateTimeField(null=True, blank=True)
    # The partition key where runs are partitioned (PostgreSQL, partitioning/runs.py): the time its
    # id carries (ids.id_time). 1970 otherwise, and for the runs made before they were partitioned.
    id_time = IdTimeField(
        db_default=EPOCH, editable=False,
        help_text="Where runs are partitioned: the time in the run's id (its partition); 1970 otherwise.",
    )
    # durable.fork(): the run whose journal this one's began with, up to the step it was forked
    # from. Its id, not a foreign key, as `parent` is not: the source may be pruned first.
    forked_from = models.UUIDField(null=True, blank=True, editable=False,
                                   help_text="The run this one was forked from (durable.fork()).")
    forked_at_step = models.CharField(max_length=255, blank=True, default="", db_default="", editable=False,
                                      help_text="The step of the source run this one was forked from: "
                                                "it and the steps after it ran on this run's code.")
    # The model row the run is about (start(..., subject=order)): a generic relation, so deleting
    # the row leaves its runs (their `subject` is then None; `subject_label` still names it).
    # No constraint and no cascade: the content types may live on another database than the durable
    # tables (DURABLE_DATABASE); a deleted content type's runs lose it by a receiver (subjects.py).
    # Looked up with subject_id, through durable_run_subject: no index of its own.
    subject_type = models.ForeignKey("contenttypes.ContentType", null=True, blank=True, on_delete=models.DO_NOTHING,
                                     db_constraint=False, related_name="+", db_index=False)
    subject_id = models.CharField(max_length=255, null=True, blank=True)
    subject = SubjectRelation("subject_type", "subject_id")
    subject_label = models.CharField(max_length=200, null=True, blank=True, help_text="str() of the subject at start.")
    # Set for a one_at_a_time workflow's run: "<content type>:<pk>", unique among its unfinished runs.
    subject_lock = models.CharField(max_length=300, null=True, blank=True, editable=False)

    objects = DurableManager.from_queryset(WorkflowRunQuerySet)()

    # What a run's end writes (endings.record_end, and in SQL queries.END_RUN, rendered from this
    # list): every outcome column, the other outcome's cleared, so that no end leaves one behind
    # (a completed run keeps no error of an earlier attempt).
    END_COLUMNS = ("status", "result", "error", "waiting_on", "finished_at", "updated_at")
    # What a claim of a run's advance writes (WorkflowRunQuerySet.mark_running, queries.mark_running).
    RUNNING_COLUMNS = ("status", "started_at", "updated_at", "waiting_on", "last_worker", "last_claimed_at")
    # Of those, what tells of the claim itself (claimed_values(), queries.claimed_by): a claim taken
    # in a batch leaves its run as it was, and the end of its turn writes these (docs/internals.md).
    CLAIMED_COLUMNS = ("started_at", "last_worker", "last_claimed_at")
    # The statuses of a run a worker is advancing: `running`, or as it was when its claim was taken
    # in a batch. A worker's hand-back moves only these (an operator's hold or an end stays).
    ADVANCING = (Status.PENDING, Status.RUNNING, Status.WAITING)

    class Meta:
        db_table = "durable_workflow_run"
        ordering = ["-created_at"]
        constraints = [
            # Starting twice with one idempotency key must give one run, race-free: the
            # database decides, not a read-then-insert.
            models.UniqueConstraint(
                fields=["workflow", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="durable_run_idempotency_key",
            ),
            # one_at_a_time: at most one unfinished run of a workflow per subject, decided by the
            # database (two concurrent starts cannot both pass a check).
            models.UniqueConstraint(
                fields=["workflow", "subject_lock"],
                condition=Q(subject_lock__isnull=False) & ~Q(status__in=[
                    "completed", "failed", "cancelled", "timed_out", "compensation_failed"]),
                name="durable_run_one_at_a_time",
            ),
        ]
        indexes = [
            # The admin's run list, newest first (its order ends with the id, as the admin's does:
            # without it the list sorts the whole table), also by status and by workflow. In
            # ascending order, read backwards: a new run's entry then goes to the last page, as the
            # pages fill, where in descending order every start would go to the first page and
            # split it in halves (measured: 149 bytes of these indexes a run against 266).
            models.Index(fields=["status", "created_at", "id"], name="durable_run_status_created"),
            models.Index(fields=["workflow", "created_at", "id"], name="durable_run_workflow_created"),
            models.Index(fields=["created_at", "id"], name="durable_run_created"),
            models.Index(fields=["finished_at"], condition=Q(finished_at__isnull=False), name="durable_run_finished"),
            # durable.runs_for(obj) and the runs shown on a model's admin page.
            models.Index(fields=["subject_type", "subject_id", "-created_at"], condition=Q(subject_id__isnull=False),
                         name="durable_run_subject"),
            # A run's children (its claim reads those that finished; a parent's delete unlinks them):
            # only runs with a parent are in it. Every index a run is in costs each of its status
            # changes an entry (a new status is a new row version, in every index).
            models.Index(fields=["parent"], condition=Q(parent__isnull=False), name="durable_run_children"),
            # A run's forks (durable.fork()), on its page: only forked runs are in it.
            models.Index(fields=["forked_from"], condition=Q(forked_from__isnull=False), name="durable_run_forks"),
        ]
        permissions = [
            ("view_payload_workflowrun", "Can view the inputs, results and errors of workflow runs"),
            ("start_workflowrun", "Can start and duplicate workflow runs"),
            ("cancel_workflowrun", "Can cancel workflow runs"),
            ("retry_workflowrun", "Can retry workflow runs from their last checkpoint"),
            ("forcefail_workflowrun", "Can force workflow runs to fail"),
            ("skipstep_workflowrun", "Can skip a step of a workflow run"),
            ("editstep_workflowrun", "Can edit the recorded result of a step"),
            ("retryrollback_workflowrun", "Can retry the rollback of workflow runs"),
            ("signal_workflowrun", "Can send signals to workflow runs"),
            ("wake_workflowrun", "Can fire the timers of workflow runs early"),
        ]

    @property
    def short_id(self) -> str:
        """The end of the id the admin, the example and the command line show (humanize.short_id)."""
        return short_id(self.pk)

    def __str__(self) -> str:
        return f"{self.workflow} {self.id} ({self.status})"


    @property
    def is_finished(self) -> bool:
        return self.status in self.TERMINAL

    def get_input(self) -> dict:
        return serialization.decode(self.input)

    def get_result(self):
        """Return the decoded result of a completed run."""
        return serialization.decode(self.result)

    def get_error(self) -> dict | None:
        return serialization.decode(self.error)

    @property
    def waiting_for(self) -> str:
        """What kind of wait the run is in (a key of WAITING_FOR), or "" when it waits for nothing."""
        if self.status in self.TERMINAL or not self.waiting_on:
            return ""
        for kind, prefixes in self.WAITING_FOR.items():
            if self.waiting_on.startswith(prefixes):
                return kind
        return ""

    def current_waiting_on(self) -> str:
        """`waiting_on`, with a fan-out's count of finished branches as it is now (one query): the
        run's text is written when it begins to wait, the count goes down as branches finish."""
        if self.status in self.TERMINAL or not self.waiting_on.startswith("parallel "):
            return self.waiting_on if self.status not in self.TERMINAL else ""
        counted = self.fan_out()
        if counted is None:
            return self.waiting_on
        group, done, total = counted
        return f"parallel {group!r}: {done} of {total} branches done"

    def fan_out(self) -> tuple[str, int, int] | None:
        """(group, branches done, branches) of the parallel group the run waits for now, or None.

        Read once per instance: a page asks for it twice (its waiting_on and its progress)."""
        if "_fan_out" not in self.__dict__:
            self.__dict__["_fan_out"] = self._count_fan_out()
        return self.__dict__["_fan_out"]

    def _count_fan_out(self) -> tuple[str, int, int] | None:
        match = _FAN_OUT.match(self.waiting_on) if self.status not in self.TERMINAL else None
        if match is None:
            return None
        total = int(match.group(2))
        remaining = (self.steps.filter(kind=Step.Kind.PARALLEL, status=Step.Status.WAITING)
                     .values_list("remaining", flat=True).first())
        if remaining is None:
            return None
        return match.group(1), max(0, total - remaining), total

    def step_counts(self) -> dict[str, int]:
        """How many of its journal entries have each status as shown (Step.shown_status: those a
        finished run left open are "stopped"), in one query (its progress is not one)."""
        counts: dict[str, int] = {}
        for status, n in (self.steps.exclude(kind=Step.Kind.PROGRESS).order_by().values_list("status")
                          .annotate(n=models.Count("pk"))):
            shown = Step.shown_status(status, Step.Kind.STEP, self.is_finished)
            counts[shown] = counts.get(shown, 0) + n
        return counts

    def progress(self) -> dict | None:
        """What ``ctx.set_progress()`` last set and committed, {"done", "total", "message"}; while
        the run waits for a fan-out and set none, how many of its branches are done; else None."""
        step = self.steps.filter(kind=Step.Kind.PROGRESS).only("result").first()
        if step is None:
            counted = self.fan_out()
            if counted is None:
                return None
            group, done, total = counted
            return {"done": done, "total": total, "message": f"parallel {group!r}"}
        told = serialization.decode(step.result) or {}
        return {"done": told.get("done"), "total": told.get("total"), "message": told.get("message", "")}

    def notes(self, limit: int = 100) -> list[dict]:
        """The notes ``ctx.note()`` added, oldest first (the last `limit`): {"key", "at", "message", "data"}."""
        steps = self.steps.filter(kind=Step.Kind.LOG).order_by("-seq").only("key", "result", "started_at")[:limit]
        notes = []
        for step in reversed(list(steps)):
            told = serialization.decode(step.result) or {}
            notes.append({"key": step.key, "at": step.started_at, "message": told.get("message", ""),
                          "data": told.get("data", {})})
        return notes

    @classmethod
    def statuses_from(cls, text: str) -> list[str]:
        """The statuses named in "failed,timed_out"; ValueError naming one that is not a status."""
        wanted = text.split(",")
        unknown = sorted(set(wanted) - set(cls.Status.values))
        if unknown:
            raise ValueError(f"Not a status: {unknown[0][:50]!r}; use {', '.join(cls.Status.values)}.")
        return wanted



# "parallel 'images': 3 of 500 branches done" (engine/composition.py writes it).
_FAN_OUT = re.compile(r"^parallel '(.*)': \d+ of (\d+) branches done")
