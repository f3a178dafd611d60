"""The durable tables: workflow runs, their step journal, the workpool and timers."""

from __future__ import annotations

import re

from django.conf import settings
from django.contrib.contenttypes.fields import GenericForeignKey
from django.db import models
from django.db.models import Case, Exists, F, OuterRef, Q, Value, When
from django.db.models.expressions import RawSQL
from django.db.models.functions import Now

from . import clock, conf, serialization
from .humanize import short_id
from .ids import EPOCH, uuid7  # noqa: F401 - migration 0001 names models.uuid7


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


class DurableManager(models.Manager):
    """Every durable model's manager: its querysets use DURABLE_DATABASE unless told otherwise
    (.using(), db_manager()), so the admin, the API and project code reading the durable tables
    find them on their own database, with or without django_durable.routers.DurableRouter."""

    def get_queryset(self):
        return self._queryset_class(model=self.model, using=self._db or conf.get("DATABASE"), hints=self._hints)


class IdTimeField(models.DateTimeField):
    """WorkflowRun.id_time: filled in from the run's id when the row is inserted (ids.id_time), so
    that every way of making a run (the ORM, bulk_create, an import) puts it in its partition."""

    def pre_save(self, model_instance, add):
        if add:
            from . import partitioning

            value = partitioning.runs.key(model_instance.pk, model_instance._state.db or conf.get("DATABASE"))
            setattr(model_instance, self.attname, value)
            return value
        return super().pre_save(model_instance, add)


class WorkflowRunQuerySet(models.QuerySet):
    def filter(self, *args, **kwargs):
        """QuerySet.filter(); where runs are partitioned, a lookup by id (pk=, pk__in=) also names
        the partitions of those ids, so that it reads them and not every one (partitioning/runs.py)."""
        from .partitioning import runs

        return super().filter(*args, **kwargs, **runs.lookup(self.db, kwargs))

    def unfinished(self):
        return self.exclude(status__in=WorkflowRun.TERMINAL)

    def finished(self):
        return self.filter(status__in=WorkflowRun.TERMINAL)

    def of_kind(self, kind: str):
        """Runs of workflows ("workflow") or of django.tasks tasks ("task"), as the registry of
        this process knows them; ValueError for another kind."""
        from . import registry

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
        return self.exclude(status__in=WorkflowRun.TERMINAL).filter(condition)

    def stuck(self, *, lease_expired: bool = True, nothing_pending: bool = True):
        """Unfinished runs whose worker's lease expired, or that nothing will ever advance.

        Nothing will advance a run that has no queued or claimed work item, no pending timer, no
        wait for a signal or event (those come from outside), and no unfinished child.
        """
        run = OuterRef("pk")
        expired = Exists(WorkItem.objects.filter(run=run, status=WorkItem.Status.PROCESSING,
                                                 claim_expires_at__lt=clock.db_now()))
        idle = (
            ~Exists(WorkItem.objects.filter(run=run, status__in=[WorkItem.Status.PENDING, WorkItem.Status.PROCESSING]))
            & ~Exists(Timer.objects.filter(run=run, status=Timer.Status.PENDING))
            & ~Exists(Step.objects.filter(run=run, status=Step.Status.WAITING,
                                          kind__in=[Step.Kind.SIGNAL, Step.Kind.EVENT, Step.Kind.APPROVAL]))
            & ~Exists(WorkflowRun.objects.filter(parent=run).exclude(status__in=WorkflowRun.TERMINAL))
        )
        if lease_expired and nothing_pending:
            condition = expired | idle
        elif lease_expired:
            condition = expired
        else:
            condition = idle
        # Named statuses rather than "not terminal": the planner then starts from the few unfinished
        # runs on the status index instead of walking the whole table.
        # A blocked run is held for an operator on purpose (durable.retry_run() resumes it).
        unfinished = [status for status in WorkflowRun.Status.values
                      if status not in WorkflowRun.TERMINAL and status != WorkflowRun.Status.BLOCKED]
        return self.filter(status__in=unfinished).filter(condition)

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

    TERMINAL = frozenset(
        {Status.COMPLETED, Status.FAILED, Status.CANCELLED, Status.TIMED_OUT, Status.COMPENSATION_FAILED}
    )
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
        # Deleting a finished parent must not take an unfinished child with it.
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children"
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
    # The model row the run is about (start(..., subject=order)): a generic relation, so deleting
    # the row leaves its runs (their `subject` is then None; `subject_label` still names it).
    # No constraint and no cascade: the content types may live on another database than the durable
    # tables (DURABLE_DATABASE); a deleted content type's runs lose it by a receiver (subjects.py).
    subject_type = models.ForeignKey("contenttypes.ContentType", null=True, blank=True, on_delete=models.DO_NOTHING,
                                     db_constraint=False, related_name="+")
    subject_id = models.CharField(max_length=255, null=True, blank=True)
    subject = SubjectRelation("subject_type", "subject_id")
    subject_label = models.CharField(max_length=200, null=True, blank=True, help_text="str() of the subject at start.")
    # Set for a one_at_a_time workflow's run: "<content type>:<pk>", unique among its unfinished runs.
    subject_lock = models.CharField(max_length=300, null=True, blank=True, editable=False)

    objects = DurableManager.from_queryset(WorkflowRunQuerySet)()

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
            # without it the list sorts the whole table), also by status and by workflow.
            models.Index(fields=["status", "-created_at", "-id"], name="durable_run_status_list"),
            models.Index(fields=["workflow", "-created_at", "-id"], name="durable_run_workflow_list"),
            models.Index(fields=["-created_at", "-id"], name="durable_run_created_list"),
            models.Index(fields=["finished_at"], condition=Q(finished_at__isnull=False), name="durable_run_finished"),
            # durable.runs_for(obj) and the runs shown on a model's admin page.
            models.Index(fields=["subject_type", "subject_id", "-created_at"], condition=Q(subject_id__isnull=False),
                         name="durable_run_subject"),
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
        """How many of its journal entries have each status, in one query (its progress is not one)."""
        return dict(self.steps.exclude(kind=Step.Kind.PROGRESS).order_by().values_list("status")
                    .annotate(n=models.Count("pk")))

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

    class Status(models.TextChoices):
        RUNNING = "running", "Running"
        RETRYING = "retrying", "Waiting to retry"
        WAITING = "waiting", "Waiting"
        COMPLETED = "completed", "Completed"
        FAILED = "failed", "Failed"

    FINAL = frozenset({Status.COMPLETED, Status.FAILED})

    # No index of its own: the unique (run, key) serves every lookup by run, and one index fewer is
    # one write fewer per checkpoint.
    run = models.ForeignKey(WorkflowRun, on_delete=models.CASCADE, related_name="steps", db_index=False)
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
        ]

    def __str__(self) -> str:
        return f"{self.key} ({self.status})"

    def get_result(self):
        return serialization.decode(self.result)


_RUNNING = ('(SELECT COUNT(*) FROM "durable_work_item" AS "running" WHERE "running"."status" = \'processing\' '
            'AND "running"."queue" = %s AND "running"."id" <> %s{same_key}) < %s')
_SAME_KEY = ' AND "running"."concurrency_key" = "durable_work_item"."concurrency_key"'


# "parallel 'images': 3 of 500 branches done" (engine/composition.py writes it).
_FAN_OUT = re.compile(r"^parallel '(.*)': \d+ of (\d+) branches done")

# The status of ready items, as a constant in the SQL (WorkItemQuerySet.ready).
_PENDING = RawSQL("'pending'", [])


def _within(limit, ending, now: str) -> RawSQL:
    """The condition an item of `limit.name` meets when its queue's limits let it be claimed now.

    The counts are what is processing now; on PostgreSQL the claim has taken its turn on the
    queue's lock first (workpool/postgres.py), so no other claim of the queue changes them meanwhile.
    """
    terms, params = [], []
    if limit.concurrency is not None:
        terms.append(_RUNNING.format(same_key=""))
        params += [limit.name, ending, limit.concurrency]
    if limit.key_concurrency is not None:
        terms.append(f'("durable_work_item"."concurrency_key" = \'\' OR {_RUNNING.format(same_key=_SAME_KEY)})')
        params += [limit.name, ending, limit.key_concurrency]
    if limit.rate is not None:
        terms.append('NOT EXISTS (SELECT 1 FROM "durable_queue" AS "rated" WHERE "rated"."name" = %s '
                     f'AND "rated"."next_claim_at" > {now})')
        params.append(limit.name)
    return RawSQL(f'("durable_work_item"."queue" <> %s OR ({" AND ".join(terms)}))', [limit.name, *params],
                  output_field=models.BooleanField())


class WorkItemQuerySet(models.QuerySet):
    def ready(self, queues=None, avoid=(), limits=(), ending=0):
        """Pending items whose time has come, in claim order (leaving out the ids in `avoid`).

        `limits` (queues.QueueLimits) leave out the items their queue's limits hold back now:
        a full queue, a full concurrency key, a rate not due yet. `ending` is the item whose end
        the claim is part of: it no longer counts as running.
        """
        # 'pending' is written into the statement, not passed as a parameter: PostgreSQL plans a
        # prepared claim once (a generic plan) only if that plan can use the partial index of
        # pending items; with `status = $1` it plans the statement again at every execution.
        qs = self.filter(status=_PENDING, available_at__lte=clock.db_now())
        if queues:
            qs = qs.filter(queue__in=queues)
        if avoid:
            qs = qs.exclude(id__in=avoid)
        if limits:
            from django.db import connections

            now = clock.now_sql(connections[self.db].vendor)
            for limit in limits:
                qs = qs.filter(_within(limit, ending, now))
        return qs.order_by("-priority", "available_at", "id")

    def expired(self):
        """Claimed items whose lease has run out (by the database's clock), or that have none.

        A processing item without a lease (written by hand, or by a bug) would otherwise be
        held for ever: it counts as expired.
        """
        return self.filter(Q(claim_expires_at__lt=clock.db_now()) | Q(claim_expires_at__isnull=True),
                           status=WorkItem.Status.PROCESSING)

    # The transitions of a work item, each written once here and called by the reaper, the
    # SQLite workpool and the operator services (the PostgreSQL statements in workpool/postgres.py
    # spell the same ones in SQL).

    def free(self, status: str, **fields) -> int:
        """Drop the claim on these items (any later write by its holder is fenced out) and set `status`."""
        return self.update(status=status, claim_token=None, claimed_by="", claim_expires_at=None, **fields)

    def requeue(self, **fields) -> int:
        """Free these items and make them ready now, for the next worker."""
        return self.free(WorkItem.Status.PENDING, available_at=clock.db_now(), **fields)

    def wake(self) -> int:
        """Make these items ready now; one being processed is flagged to go again when it ends."""
        Status = WorkItem.Status
        return self.update(
            status=Case(When(status=Status.COMPLETED, then=Value(Status.PENDING)), default=F("status")),
            available_at=Case(When(status=Status.COMPLETED, then=clock.db_now()), default=F("available_at")),
            wake=Case(When(status=Status.PROCESSING, then=Value(True)), default=F("wake")),
        )

    def end(self, status: str, **fields) -> int:
        """Free these items with their delivery count reset, as an item that finished its turn."""
        fields.setdefault("available_at", clock.db_now())
        return self.free(status, attempts=0, wake=False, **fields)


class WorkItem(models.Model):
    """One unit in the workpool: advance a run, run a step, or run a task."""

    class Kind(models.TextChoices):
        ADVANCE = "advance", "Advance run"
        STEP = "step", "Run step"
        TASK = "task", "Run task"

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        PROCESSING = "processing", "Processing"
        COMPLETED = "completed", "Completed"
        FAILED = "failed", "Failed"
        CANCELLED = "cancelled", "Cancelled"

    kind = models.CharField(max_length=20, choices=Kind.choices, default=Kind.ADVANCE)
    run = models.ForeignKey(
        WorkflowRun, null=True, blank=True, on_delete=models.CASCADE, related_name="work_items"
    )
    step_key = models.CharField(max_length=255, blank=True, default="")
    group = models.CharField(
        max_length=255, blank=True, default="", help_text="A step item's parallel group (its journal key)."
    )
    function = models.CharField(
        max_length=255, blank=True, default="", help_text="A step item's function, module.qualname."
    )
    input = models.TextField(null=True, blank=True, help_text="JSON: a step item's arguments and options.")
    queue = models.CharField(max_length=100, default="default")
    priority = models.IntegerField(default=0)
    concurrency_key = models.CharField(
        max_length=200, blank=True, default="", db_default="", help_text="Its run's concurrency key."
    )
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PENDING)
    available_at = models.DateTimeField(db_default=Now())
    attempts = models.PositiveIntegerField(
        default=0, help_text="Deliveries since the item last finished; counted at claim."
    )
    wake = models.BooleanField(
        default=False, help_text="Set when a wakeup arrives while the item is being processed."
    )
    claim_token = models.UUIDField(
        null=True, blank=True, help_text="Set while, and only while, the item is processing."
    )
    claimed_by = models.CharField(max_length=200, blank=True, default="")
    claim_expires_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    missing_since = models.DateTimeField(
        null=True, blank=True,
        help_text="Since when the workers that claimed it lacked its workflow or branch function (a rolling deploy).",
    )
    created_at = models.DateTimeField(db_default=Now())

    objects = DurableManager.from_queryset(WorkItemQuerySet)()

    class Meta:
        db_table = "durable_work_item"
        permissions = [("release_workitem", "Can release the claims of work items")]
        constraints = [
            # A run has exactly one advance item, reused for every advance: a wakeup flips it
            # back to pending (or sets `wake` while it is processing), so wakeups never pile
            # up and two workers can never advance one run at once.
            models.UniqueConstraint(
                fields=["run"], condition=Q(kind="advance"), name="durable_one_advance_per_run"
            ),
        ]
        indexes = [
            # The claim path: only pending rows, in claim order. Partial, so the index stays
            # as small as the backlog however many finished items the table holds. Workers
            # that serve every queue read the first; workers of one queue read the second, so
            # a backlog in another queue is never scanned.
            models.Index(
                fields=["-priority", "available_at", "id"],
                condition=Q(status="pending"),
                name="durable_work_item_ready",
            ),
            models.Index(
                fields=["queue", "-priority", "available_at", "id"],
                condition=Q(status="pending"),
                name="durable_work_item_ready_q",
            ),
            # The reaper's path: claims by expiry.
            models.Index(
                fields=["claim_expires_at"],
                condition=Q(status="processing"),
                name="durable_work_item_claimed",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.run_id} ({self.status})"


class QueueState(models.Model):
    """What a queue's rate limit remembers across workers: the earliest its next claim may be.

    A row exists only for a queue with a rate_limit (DURABLE_QUEUES), made by its first claim.
    """

    name = models.CharField(max_length=100, primary_key=True)
    next_claim_at = models.DateTimeField()

    objects = DurableManager()

    class Meta:
        db_table = "durable_queue"

    def __str__(self) -> str:
        return self.name


class Timer(models.Model):
    """Something that must happen at a time: wake a sleeping run, retry a step, start a run."""

    class Kind(models.TextChoices):
        SLEEP = "sleep", "Sleep"
        RETRY = "retry", "Retry"
        SIGNAL_TIMEOUT = "signal_timeout", "Signal timeout"
        DEADLINE = "deadline", "Deadline"
        SCHEDULE = "schedule", "Schedule"
        DELAYED_START = "delayed_start", "Delayed start"

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        FIRED = "fired", "Fired"
        CANCELLED = "cancelled", "Cancelled"

    kind = models.CharField(max_length=20, choices=Kind.choices)
    run = models.ForeignKey(
        WorkflowRun, null=True, blank=True, on_delete=models.CASCADE, related_name="timers"
    )
    step_key = models.CharField(max_length=255, blank=True, default="")
    fire_at = models.DateTimeField()
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PENDING)
    created_at = models.DateTimeField(db_default=Now())
    fired_at = models.DateTimeField(null=True, blank=True)

    objects = DurableManager()

    class Meta:
        db_table = "durable_timer"
        indexes = [
            models.Index(
                fields=["fire_at"], condition=Q(status="pending"), name="durable_timer_due"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.run_id} at {self.fire_at:%Y-%m-%d %H:%M:%S} ({self.status})"


class SignalMessage(models.Model):
    """A signal sent to a run, or an event delivered to a run that waited for it.

    Signals wait in FIFO order until the run consumes them; an event is delivered to one wait of
    the run (`target_key` names it): one already waiting when it is emitted, or one that began
    later and took the kept event (`event`). Consuming one is recorded in the same statement as
    the journal entry that returns it, so none is consumed twice or lost.
    """

    class Kind(models.TextChoices):
        SIGNAL = "signal", "Signal"
        EVENT = "event", "Event"
        APPROVAL = "approval", "Approval decided"

    run = models.ForeignKey(WorkflowRun, on_delete=models.CASCADE, related_name="signals")
    kind = models.CharField(max_length=10, choices=Kind.choices, default=Kind.SIGNAL)
    name = models.CharField(max_length=200)
    payload = models.TextField(default="null", help_text="JSON.")
    target_key = models.CharField(max_length=255, blank=True, default="")
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)
    event = models.ForeignKey(
        "StoredEvent", null=True, blank=True, on_delete=models.SET_NULL, related_name="deliveries",
        help_text="The emitted event this message delivers (one delivery per run and event).",
    )
    created_at = models.DateTimeField(db_default=Now())
    consumed_at = models.DateTimeField(null=True, blank=True)
    consumed_by = models.CharField(max_length=255, blank=True, default="", help_text="The wait's key.")

    objects = DurableManager()

    class Meta:
        db_table = "durable_signal"
        ordering = ["run", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="durable_signal_idempotency_key",
            ),
            # A run takes an emitted event once, whichever way it arrives (delivered to a wait
            # already there, or found by a wait that began later).
            models.UniqueConstraint(fields=["run", "event"], condition=Q(event__isnull=False),
                                    name="durable_signal_one_event_per_run"),
        ]
        indexes = [
            # A claim reads the run's unconsumed messages.
            models.Index(fields=["run", "id"], condition=Q(consumed_at__isnull=True), name="durable_signal_unconsumed"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.name} to {self.run_id}"

    def get_payload(self):
        return serialization.decode(self.payload)


class StoredEvent(models.Model):
    """An event emitted with ``durable.emit_event()`` (or ``ctx.emit()``), kept for
    DURABLE_EVENT_RETENTION, so that a run that begins waiting for it a moment later still takes it."""

    name = models.CharField(max_length=200)
    payload = models.TextField(default="null", help_text="JSON.")
    created_at = models.DateTimeField(db_default=Now())

    objects = DurableManager()

    class Meta:
        db_table = "durable_event"
        ordering = ["id"]
        indexes = [models.Index(fields=["name", "created_at"], name="durable_event_name")]
        verbose_name = "emitted event"

    def __str__(self) -> str:
        return f"event {self.name} at {self.created_at:%Y-%m-%d %H:%M:%S}"

    def get_payload(self):
        return serialization.decode(self.payload)


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


class StoredPayload(models.Model):
    """A payload written to STORAGES["durable"] instead of its column (payloads.py): the prune
    deletes the file with its run. No foreign key: a run's input is stored before the run is."""

    run_id = models.UUIDField(db_index=True)
    name = models.CharField(max_length=255, unique=True)
    bytes = models.PositiveBigIntegerField()
    created_at = models.DateTimeField(db_default=Now())

    objects = DurableManager()

    class Meta:
        db_table = "durable_stored_payload"

    def __str__(self) -> str:
        return self.name


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
        from .schedules import upcoming

        return upcoming(self, count)


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
        RECOVERED = "recovered", "Advance given back"
        BLOCKED = "blocked", "Blocked: the code changed"
        APPROVED = "approved", "Approved"
        REJECTED = "rejected", "Rejected"

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
