"""The workpool's tables: work items and their QuerySet verbs (every transition of an item), the
queues' rate-limit state, and timers."""

from __future__ import annotations

from django.db import models
from django.db.models import Case, F, Q, Value, When
from django.db.models.expressions import RawSQL
from django.db.models.functions import Coalesce, Now

from .. import clock
from .base import DurableManager


_RUNNING = ('(SELECT COUNT(*) FROM "durable_work_item" AS "running" WHERE "running"."status" = \'processing\' '
            'AND "running"."queue" = %s AND "running"."id" <> %s{same_key}) < %s')
_SAME_KEY = ' AND "running"."concurrency_key" = "durable_work_item"."concurrency_key"'


# The status of ready items, as a constant in the SQL (WorkItemQuerySet.ready).
_PENDING = RawSQL("'pending'", [])
# And as a sub-select, whose value PostgreSQL's planner does not see, for the lookups of a run's own
# pending rows by its id (the ORM's and, in SQL, workpool.queries'). With `status = 'pending'` the
# planner may walk a whole index of pending items instead (its predicate is that status), and does
# once an ANALYZE made while a snapshot was held counted nothing pending in an index that still holds
# every entry the snapshot keeps: hundreds of thousands at every end (tests/harness/plans.py,
# held-snapshot).
PENDING_UNSEEN = RawSQL("SELECT 'pending'", [])


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


# The items after a place in the claim order (WorkItemQuerySet.ready's `floor`): those of a higher
# priority, and those of its priority at or after it. Each part alone is a range of the ready index
# (workpool/postgres.py claims from both and takes the first): PostgreSQL starts its walk at the
# place, not at the index's first entry. SQLite compares row values as well.
_ABOVE = '"durable_work_item"."priority" > %s'
_FROM = ('"durable_work_item"."priority" = %s AND ("durable_work_item"."available_at", "durable_work_item"."id") '
         '>= (%s, %s)')


def after(floor, part: str | None = None) -> RawSQL:
    """The condition of the items after `floor` (priority, available_at, id) in the claim order:
    of a higher priority (`part` "above"), of its priority at or after it ("from"), or either (None)."""
    priority = floor[0]
    if part == "above":
        return RawSQL(_ABOVE, [priority], output_field=models.BooleanField())
    if part == "from":
        return RawSQL(_FROM, list(floor), output_field=models.BooleanField())
    return RawSQL(f"({_ABOVE} OR ({_FROM}))", [priority, *floor], output_field=models.BooleanField())


def _ready_again():
    """When an item made ready again is ready: now, or in a fair queue at its turn (workpool/fairness.py)."""
    return Coalesce(F("turn"), clock.db_now())


class WorkItemQuerySet(models.QuerySet):
    def ready(self, queues=None, avoid=(), limits=(), ending=0, floor=None):
        """Pending items whose time has come, in claim order (leaving out the ids in `avoid`).

        `limits` (queues.QueueLimits) leave out the items their queue's limits hold back now:
        a full queue, a full concurrency key, a rate not due yet. `ending` is the item whose end
        the claim is part of: it no longer counts as running. `floor` (priority, available_at,
        id) keeps only the items after it in the claim order (workpool/claiming.py, Floors).
        The items of queues paused at runtime (QueueControl.paused) are left out, by the statement
        itself: a pause is in force from every worker's next claim.
        """
        # 'pending' is written into the statement, not passed as a parameter: PostgreSQL plans a
        # prepared claim once (a generic plan) only if that plan can use the partial index of
        # pending items; with `status = $1` it plans the statement again at every execution.
        qs = self.filter(status=_PENDING, available_at__lte=clock.db_now())
        if queues:
            qs = qs.filter(queue__in=queues)
        qs = qs.exclude(queue__in=paused_queues())
        if avoid:
            qs = qs.exclude(id__in=avoid)
        if floor is not None:
            qs = qs.filter(after(floor))
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
        """Free these items and make them ready now (an item of a fair queue at its turn), for the next worker."""
        return self.free(WorkItem.Status.PENDING, available_at=_ready_again(), **fields)

    def wake(self) -> int:
        """Make these items ready now (an item of a fair queue at its turn, see fairness.py); one
        being processed is flagged to go again when it ends. A pending one is written too, unchanged:
        a claim under way sees that its item changed and flags it (queries.SNAPSHOT_MOVED)."""
        Status = WorkItem.Status
        return self.update(
            status=Case(When(status=Status.COMPLETED, then=Value(Status.PENDING)), default=F("status")),
            available_at=Case(When(status=Status.COMPLETED, then=_ready_again()),
                              default=F("available_at")),
            wake=Case(When(status=Status.PROCESSING, then=Value(True)), default=F("wake")),
        )

    def take(self, *, token, worker: str, lease_expires) -> int:
        """Claim these items for `worker` with `token` until `lease_expires` (an expression on the
        database's clock), counting the delivery: every column of WorkItem.CLAIM_COLUMNS. The caller
        conditions it (still pending: a compare-and-set). Return how many."""
        return self.update(status=WorkItem.Status.PROCESSING, claim_token=token, claimed_by=worker,
                           claim_expires_at=lease_expires, attempts=F("attempts") + 1, wake=False)

    def drop(self) -> int:
        """Delete these items (a run's advance item at the run's end: nothing will advance it again;
        a retry makes a new one). Any later write by a holder is fenced out. Return how many."""
        return self.delete()[0]

    def end(self, status: str, **fields) -> int:
        """Free these items as items that finished their turn, writing every column of
        WorkItem.END_COLUMNS (end_values()); `fields` override some (a branch's retry gives its
        back-off as `available_at`). Return how many."""
        return self.update(**{**end_values(status), **fields})


def end_values(status: str) -> dict:
    """The values an item's end writes, one per column of WorkItem.END_COLUMNS: the claim dropped,
    the delivery count reset, no wake flag or missing-code stamp, ready again now (in a fair queue
    at its turn) if it is pending, and an advance item's step forgotten (a branch keeps its key)."""
    return {
        "status": status, "available_at": _ready_again(), "claim_token": None, "claimed_by": "",
        "claim_expires_at": None, "attempts": 0, "wake": False, "missing_since": None,
        "step_key": Case(When(kind=WorkItem.Kind.ADVANCE, then=Value("")), default=F("step_key")),
    }


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
    # No constraint in the database (docs/decisions.md, "The hot rows hang off their run without a
    # constraint"): an item is only ever made with its run or by a claim of its run, and Django's
    # deletions still cascade. The constraint cost every start a lookup and a lock of the run.
    run = models.ForeignKey(
        "WorkflowRun", null=True, blank=True, on_delete=models.CASCADE, related_name="work_items",
        db_constraint=False,
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
    turn = models.DateTimeField(
        null=True, blank=True,
        help_text="In a fair queue, the item's place in the turns of the concurrency keys (workpool/fairness.py): "
                  "its available_at when it was queued, and again whenever it is woken. Empty elsewhere.",
    )

    objects = DurableManager.from_queryset(WorkItemQuerySet)()

    # What an item's end writes (WorkItemQuerySet.end, and in SQL queries.END_ITEM, rendered from
    # this list): every column its claim or its turn set, so that no way of ending leaves one behind.
    # What a claim writes (WorkItemQuerySet.take, and in SQL queries.claim_item).
    CLAIM_COLUMNS = ("status", "claim_token", "claimed_by", "claim_expires_at", "attempts", "wake")
    END_COLUMNS = ("status", "available_at", "claim_token", "claimed_by", "claim_expires_at", "attempts", "wake",
                   "missing_since", "step_key")

    class Meta:
        db_table = "durable_work_item"
        permissions = [("release_workitem", "Can release the claims of work items")]
        constraints = [
            # A run has exactly one advance item until it ends (its end deletes it), reused for
            # every advance: a wakeup flips it back to pending (or sets `wake` while it is
            # processing), so wakeups never pile up and two workers can never advance one run at once.
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


class FairTurn(models.Model):
    """Where a concurrency key of a fair queue is in the queue's turns (workpool/fairness.py): the
    turn its next item takes, and how many items have taken that turn already (up to its weight)."""

    queue = models.CharField(max_length=100)
    key = models.CharField(max_length=200, blank=True)
    turn = models.DateTimeField()
    used = models.PositiveIntegerField(default=0)

    objects = DurableManager()

    class Meta:
        db_table = "durable_fair_turn"
        constraints = [models.UniqueConstraint(fields=["queue", "key"], name="durable_fair_turn_key")]

    def __str__(self) -> str:
        return f"{self.queue} / {self.key or '(no key)'} at {self.turn}"


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


def paused_queues():
    """The names of the queues paused at runtime, as a subquery the statement that uses it reads
    (written out: the same SQL whatever Django's version quotes its own aliases as)."""
    return RawSQL("SELECT name FROM durable_queue_control WHERE paused", [])


class QueueControl(models.Model):
    """A queue steered at runtime (services/queue_control.py): paused, or with limits that override
    DURABLE_QUEUES, until cleared. Workers read these rows before each claim (queues.refresh())."""

    name = models.CharField(max_length=100, primary_key=True)
    paused = models.BooleanField(default=False)
    concurrency = models.PositiveIntegerField(null=True, blank=True, help_text="Overrides DURABLE_QUEUES' concurrency.")
    key_concurrency = models.PositiveIntegerField(null=True, blank=True,
                                                  help_text="Overrides DURABLE_QUEUES' key_concurrency.")
    rate_limit = models.CharField(max_length=50, blank=True, default="", help_text="Overrides DURABLE_QUEUES' rate_limit.")
    reason = models.CharField(max_length=500, blank=True, default="")
    changed_at = models.DateTimeField(db_default=Now())
    changed_by = models.CharField(max_length=200, blank=True, default="")

    objects = DurableManager()

    class Meta:
        db_table = "durable_queue_control"
        indexes = [
            # What every claim reads (models.pool.paused_queues()). Through an index even where a batch's
            # claim turns sequential scans off: a scan priced as disabled made the claim costly enough
            # to be compiled by the JIT at every execution (130 ms a claim).
            models.Index(fields=["name"], condition=Q(paused=True), name="durable_queue_paused"),
        ]

    def __str__(self) -> str:
        return self.name


class QueueChange(models.Model):
    """The audit trail of queues steered at runtime: who changed what, when."""

    queue = models.CharField(max_length=100)
    at = models.DateTimeField(db_default=Now())
    actor = models.CharField(max_length=200, blank=True, default="", help_text="Who: a user name, or empty for code.")
    change = models.JSONField(default=dict, help_text="What: paused, resumed, limits set or cleared.")

    objects = DurableManager()

    class Meta:
        db_table = "durable_queue_change"
        indexes = [models.Index(fields=["queue", "-at"], name="durable_queue_change_queue")]

    def __str__(self) -> str:
        return f"{self.queue} {self.change}"


class StartGate(models.Model):
    """What start(..., debounce=...) and start(..., throttle=...) remember of one key of a workflow
    (services/gates.py): the run a debounce holds back, the start times a throttle has given out.
    Its row is locked for the start's transaction, so concurrent starts with one key take turns."""

    class Kind(models.TextChoices):
        DEBOUNCE = "debounce", "Debounce"
        THROTTLE = "throttle", "Throttle"

    workflow = models.CharField(max_length=200)
    kind = models.CharField(max_length=10, choices=Kind.choices)
    key = models.CharField(max_length=200)
    run_id = models.UUIDField(null=True, blank=True, help_text="Debounce: the run waiting for quiet.")
    starts = models.JSONField(default=list, blank=True,
                              help_text="Throttle: the start times given out last (ISO 8601), at most its limit.")
    updated_at = models.DateTimeField(auto_now=True)

    objects = DurableManager()

    class Meta:
        db_table = "durable_start_gate"
        constraints = [models.UniqueConstraint(fields=["workflow", "kind", "key"], name="durable_start_gate_key")]

    def __str__(self) -> str:
        return f"{self.kind} {self.workflow} {self.key}"


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
        "WorkflowRun", null=True, blank=True, on_delete=models.CASCADE, related_name="timers"
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
