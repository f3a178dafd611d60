"""The workpool: claiming work items, leases, fenced writes, release, wakeups and reaping.

This package is the only code that locks rows. Every write a worker makes after a claim is
conditioned on the claim token it got, so a worker that lost its lease (paused, partitioned, too
slow) changes nothing. Times are the database's (see clock.py).

The hot path (claim, journal writes, finish, release) has one implementation per database:
``postgres`` does each in a single statement, ``sqlite`` with compare-and-set updates.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
import uuid
from dataclasses import dataclass, field

from django.db import connections, transaction
from django.db.models import DateTimeField, ExpressionWrapper, F, Q, Value
from django.db.models.functions import Coalesce

from .. import clock, conf, faults, serialization
from .. import queues as durable_queues
from ..interrupts import LeaseLost
from ..models import Step, Timer, WorkflowRun, WorkItem
from . import cancelling, evidence, postgres, queries, sqlite
from ..journal import StepRecord
from .rows import Child, Entry, Message

logger = logging.getLogger("django_durable.worker")

NOTIFY_CHANNEL = "durable_work"

Status = WorkItem.Status
RunStatus = WorkflowRun.Status


@dataclass
class RunState:
    """What replay needs of a run, read in the same statement that claimed it (PostgreSQL)."""

    workflow: str
    input: str
    attempt: int
    max_attempts: int
    deadline_at: dt.datetime | None
    cancel_requested: bool
    journal: list[Entry]  # every recorded entry of the run (for a branch, its own)
    messages: list[Message]  # unconsumed, oldest first
    children: list[Child] = field(default_factory=list)  # the finished ones


@dataclass
class Claim:
    """A worker's hold on one work item, valid while its lease lasts."""

    item_id: int
    kind: str
    run_id: uuid.UUID | None
    step_key: str
    attempts: int
    token: uuid.UUID
    worker: str
    db: str
    valid_until: float  # time.monotonic() by which the lease is surely still ours
    db_time: dt.datetime | None = None  # the database's clock when the claim statement began...
    sent_at: float = 0.0  # ...time.monotonic() just before it was sent...
    db_time_at: float = 0.0  # ...and just after its answer came
    run: RunState | None = None  # None: the run finished (or vanished) before this claim
    lost: bool = field(default=False)
    reported: bool = False  # the loss was logged (once per claim)
    cancel_requested: bool = False  # learnt at claim, at each checkpoint, heartbeat and cancel poll
    # While user code of a step runs (set by the alarm): when it must end (time.monotonic()),
    # and whether a cancel may interrupt it (None: no step is running).
    step_deadline: float | None = None
    step_active: bool | None = None
    cancel_seen_at: float | None = None  # time.monotonic() when this worker learnt of a cancel...
    cancel_sent_at: float | None = None  # ...and when, its grace over, it interrupted the step
    cancel_raised: bool = False
    # The worker's next claim, made by the same statement that ended this one (PostgreSQL).
    next_claim: Claim | None = field(default=None, repr=False)
    # The earliest timer the statement that ended this claim set, so the worker can fire it on time.
    earliest_timer: dt.datetime | None = None
    # A step item's function (module.qualname), its input (JSON) and its parallel group.
    function: str = ""
    input: str | None = None
    group: str = ""

    def db_now(self) -> dt.datetime:
        """The latest the database's clock can read now, estimated without a round trip.

        The claim statement's timestamp was taken after we sent it, so counting from the moment
        of sending never falls behind the database: a sleep, back-off or deadline set from this
        never ends early, however long the statement took.
        """
        if clock.is_frozen() or self.db_time is None:
            return clock.now()
        return self.db_time + dt.timedelta(seconds=time.monotonic() - self.sent_at)

    def db_earliest(self) -> dt.datetime:
        """The earliest the database's clock can read now (counted from the claim's answer)."""
        if clock.is_frozen() or self.db_time is None:
            return clock.now()
        return self.db_time + dt.timedelta(seconds=time.monotonic() - self.db_time_at)

    def db_passed(self, when: dt.datetime) -> bool:
        """True only if `when` has surely passed on the database's clock (never early)."""
        return when <= self.db_earliest()

    def db_seconds_until(self, when: dt.datetime) -> float:
        """Seconds until `when` on the database's clock, at least (never short)."""
        return (when - self.db_earliest()).total_seconds()

    def alive(self) -> bool:
        """Return True while the lease surely holds; a False is final."""
        if not self.lost and time.monotonic() >= self.valid_until:
            self.lost = True
        return not self.lost

    def fence(self):
        """The work item, only while this claim still owns it."""
        return WorkItem.objects.using(self.db).filter(
            id=self.item_id, claim_token=self.token, status=Status.PROCESSING
        )


def _backend(db: str):
    return postgres if connections[db].vendor == "postgresql" else sqlite


def lease_seconds() -> float:
    return float(conf.get("LEASE_SECONDS"))


def _valid_until(started: float) -> float:
    # Counted from before the statement that set the lease, so it ends no later than the
    # database's deadline; the margin covers clock-rate drift between the two machines.
    lease = lease_seconds()
    return started + lease - min(2.0, lease * 0.05)


@dataclass(frozen=True)
class ClaimRequest:
    """What a worker asks for when it claims: who it is, which queues it serves, and the items it
    just declined for lack of their code (`avoid`: the workers that have it go first)."""

    worker: str
    queues: list[str] | None
    avoid: tuple[int, ...] = ()


def claim(*, worker: str, queues: list[str] | None, db: str, avoid: tuple[int, ...] = ()) -> Claim | None:
    """Claim the next ready work item for `worker` (not one in `avoid`); return the Claim (with its run) or None."""
    return _claimed(db, ClaimRequest(worker, queues, avoid), lambda then: _backend(db).claim(**then))


def _claimed(db: str, request: ClaimRequest | None, run) -> Claim | None:
    """Call `run` with the parameters of a claim for `request`; turn the row it returns into a Claim."""
    if request is None:
        run(None)
        return None
    token = uuid.uuid4()
    started = time.monotonic()
    row = run({"worker": request.worker[:200], "queues": request.queues, "db": db, "token": token,
               "lease": lease_seconds(), "avoid": request.avoid})
    if row is None:
        return None
    answered = time.monotonic()
    result = Claim(
        item_id=row.item_id, kind=row.kind, run_id=row.run_id, step_key=row.step_key, attempts=row.attempts,
        token=token, worker=request.worker, db=db, valid_until=_valid_until(started),
        # SQLite's clock is this machine's, read after the statement: exact, not a bracket.
        db_time=row.db_now, sent_at=started if _backend(db) is postgres else answered, db_time_at=answered,
        run=row.run, cancel_requested=bool(row.run and row.run.cancel_requested),
        function=row.function or "", input=row.input, group=row.group or "",
    )
    if faults.active:
        faults.hit("after_claim_commit", result.step_key)
    return result


def record_steps(claim: Claim, records: list[StepRecord]) -> None:
    """Write `records` to the journal if `claim` still holds; raise LeaseLost otherwise.

    One statement; inside an atomic=True step it joins the step's transaction.
    """
    if not records:
        return
    written, cancel = _backend(claim.db).record_steps(claim, records)
    if written != len(records):
        claim.lost = True
        raise LeaseLost(f"claim {claim.token} no longer holds; {records[0].key!r} not recorded")
    claim.cancel_requested = claim.cancel_requested or cancel


def finish_run(claim: Claim, *, status: str, result: str | None, error: str | None,
               records: list[StepRecord] = (), then: ClaimRequest | None = None) -> str | None:
    """Record the last journal entries and the run's outcome, and free its work item.

    Fenced and atomic. Return the status the run ended with (``cancelled`` when a cancel
    committed first), or None (writing nothing) if the claim is lost. With `then`, the same
    statement claims the worker's next item, left in ``claim.next_claim`` (PostgreSQL).
    """
    if faults.active:
        faults.hit("before_terminal_commit")

    def end(then_params):
        return _backend(claim.db).finish_run(claim, status=status, result=result, error=error,
                                             records=list(records), then=then_params)

    if status == RunStatus.COMPLETED:
        return _ending(claim, then, end)
    # Any other ending takes the run's unfinished children with it, in the same transaction:
    # nothing would wait for them any more. Rare, so no chained claim: a claim made inside a
    # transaction that then fails to commit would not exist.
    with transaction.atomic(using=claim.db):
        descendants = cancelling.lock_descendants(claim.run_id, claim.db)
        final = _ending(claim, None, end)
        if final is not None:
            cancelling.cancel_descendants(descendants, why=f"Its parent run {claim.run_id} ended {final}.",
                                          db=claim.db)
    return final


def release(claim: Claim, *, run_status: str, waiting_on: str = "", records: list[StepRecord] = (),
            timers: list[tuple[str, str, dt.datetime]] = (), items: list[tuple[str, str, str, str]] = (),
            then: ClaimRequest | None = None) -> bool:
    """Hand the run back, fenced: it waits (`waiting`) or goes back to the queue (`pending`).

    A waiting run's item goes idle unless a wakeup arrived meanwhile; a pending run's item is
    ready again at once. `timers` are (kind, step key, fire at) to create for the run, in the
    same transaction; `items` are (key, group, function, input) of parallel branches to queue.
    Return False (writing nothing) if the claim was already lost. With `then`, the same
    statement claims the worker's next item (see finish_run).
    """
    requeue = run_status == RunStatus.PENDING
    held = _ending(claim, then, lambda then_params: _backend(claim.db).release(
        claim, run_status=run_status, waiting_on=waiting_on[:500], requeue=requeue, records=list(records),
        timers=list(timers), items=list(items), notify=requeue and conf.get("LISTEN_NOTIFY"), then=then_params,
    ))
    if held and timers:
        claim.earliest_timer = min(fire_at for _, _, fire_at in timers)
    return held


def finish_branch(claim: Claim, record: StepRecord, *, failed: bool, fail_fast: bool,
                  then: ClaimRequest | None = None) -> bool:
    """Record a branch's outcome and count it off its group (waking the run when it is done); fenced."""
    return _ending(claim, then, lambda then_params: _backend(claim.db).finish_branch(
        claim, record, group=claim.group, failed=failed, fail_fast=fail_fast, then=then_params
    ))


def retry_branch(claim: Claim, record: StepRecord, *, retry_at: dt.datetime,
                 then: ClaimRequest | None = None) -> bool:
    """Record a branch's failed attempt and queue it again for `retry_at`; fenced."""
    return _ending(claim, then, lambda then_params: _backend(claim.db).retry_branch(
        claim, record, retry_at=retry_at, then=then_params
    ))


def _ending(claim: Claim, then: ClaimRequest | None, end):
    """Run `end(then_params)`, which returns (outcome, next claim's row); keep the next claim.

    A falsy outcome means the fence did not hold: the claim is lost.
    """
    outcome = {}

    def run(then_params):
        outcome["value"], row = end(then_params)
        return row

    claim.next_claim = _claimed(claim.db, then, run)
    if not outcome["value"]:
        claim.lost = True
    return outcome["value"]


def renew(claim: Claim) -> bool:
    """Extend the lease of `claim`; return False (and mark it lost) if it is no longer ours."""
    if claim.lost:
        return False
    started = time.monotonic()
    if claim.fence().update(claim_expires_at=lease_expiry()) != 1:
        claim.lost = True
        return False
    claim.valid_until = _valid_until(started)
    check_cancel(claim)
    if faults.active:
        faults.hit("after_heartbeat")
    return True


def check_cancel(claim: Claim) -> bool:
    """Return whether someone asked to cancel the claim's run, learning it from the database once."""
    if claim.run_id is not None and not claim.cancel_requested:
        claim.cancel_requested = WorkflowRun.objects.using(claim.db).filter(
            id=claim.run_id, cancel_requested_at__isnull=False
        ).exists()
    return claim.cancel_requested


def lease_expiry():
    return ExpressionWrapper(
        clock.db_now() + Value(dt.timedelta(seconds=lease_seconds())), output_field=DateTimeField()
    )


def note_step(claim: Claim, key: str) -> None:
    """Note on the run's work item the step a redelivered advance is starting (fenced)."""
    if claim.fence().update(step_key=key[:255]) != 1:
        claim.lost = True
        raise LeaseLost(f"claim {claim.token} no longer holds; step {key!r} not started")


def recorded(claim: Claim, records: list[StepRecord]) -> bool:
    """Return True if `records` are in the journal as written: a commit whose answer was lost.

    Reads on a fresh connection; any database error means "not known to be recorded".
    """
    from django.db import DatabaseError

    connections[claim.db].close()
    try:
        found = dict(
            Step.objects.using(claim.db)
            .filter(run_id=claim.run_id, key__in=[r.key for r in records])
            .values_list("key", "status")
        )
    except DatabaseError:
        connections[claim.db].close()
        return False
    return all(found.get(r.key) == r.status for r in records)


def missing_code_delay() -> float:
    """Seconds an item handed back for lack of its code waits before it is ready again. The
    worker that handed it back then avoids it as long again, so that a worker with the code,
    polling meanwhile, takes it first instead of racing the one without it."""
    return max(0.05, min(5.0, float(conf.get("MISSING_CODE_GRACE_SECONDS")) / 4))


def defer_missing(claim: Claim, what: str) -> str:
    """Hand back an item whose code (`what`) this worker lacks, for a worker that has it; fenced.

    Not counted as a delivery: a worker of the old code during a rolling deploy is not a crash.
    The item comes back after a short delay, so a worker without the code does not spin on it.
    Return "deferred"; "expired" (writing nothing) once workers have lacked it for
    DURABLE_MISSING_CODE_GRACE_SECONDS, so the caller fails it; or "lost".
    """
    grace = float(conf.get("MISSING_CODE_GRACE_SECONDS"))
    if grace <= 0:
        return "expired"  # the caller's fenced failure finds out if the claim is lost
    delay = dt.timedelta(seconds=missing_code_delay())
    now = clock.db_now()
    since = ExpressionWrapper(now - Value(dt.timedelta(seconds=grace)), output_field=DateTimeField())
    with transaction.atomic(using=claim.db):
        # Within the grace (or the first miss, with no stamp yet): hand it back.
        handed_back = claim.fence().exclude(missing_since__lte=since).free(
            Status.PENDING, attempts=F("attempts") - 1, wake=False,
            available_at=ExpressionWrapper(now + Value(delay), output_field=DateTimeField()),
            missing_since=Coalesce(F("missing_since"), now),
            last_error=f"Worker {claim.worker} does not have {what}; left for a worker that has it."[:2000],
        )
        if not handed_back:
            if claim.fence().exists():
                return "expired"
            claim.lost = True
            return "lost"
        if claim.kind == WorkItem.Kind.ADVANCE:
            WorkflowRun.objects.using(claim.db).filter(id=claim.run_id, status=RunStatus.RUNNING).update(
                status=RunStatus.PENDING, waiting_on=f"a worker that has {what}"[:500], updated_at=now,
            )
    logger.warning("Worker %s does not have %s (run %s); left for a worker that has it.",
                   claim.worker, what, claim.run_id)
    return "deferred"


def retry_run(claim: Claim, *, retry_at: dt.datetime, error: str, records: list[StepRecord], waiting_on: str) -> bool:
    """Schedule the run to go again from its last checkpoint at `retry_at`, fenced.

    Its failed steps are forgotten (they run again), its attempt is counted, and a timer wakes
    it. Return False (writing nothing) if the claim is lost.
    """
    record_steps(claim, records)
    with transaction.atomic(using=claim.db):
        if not claim.fence().end(Status.COMPLETED, step_key=""):
            claim.lost = True
            return False
        evidence.keep(claim.run_id, attempt=claim.run.attempt, status=RunStatus.FAILED, error=error,
                      worker=claim.worker, db=claim.db)
        Step.objects.using(claim.db).filter(run_id=claim.run_id, status=Step.Status.FAILED).delete()
        WorkflowRun.objects.using(claim.db).filter(id=claim.run_id).update(
            status=RunStatus.WAITING, attempt=F("attempt") + 1, error=error, waiting_on=waiting_on[:500],
            updated_at=clock.db_now(),
        )
        Timer.objects.using(claim.db).create(kind=Timer.Kind.RETRY, run_id=claim.run_id, fire_at=retry_at)
    return True


# -- timers and wakeups -----------------------------------------------------------------------


TIMER_BATCH = 1000


def fire_timers(*, db: str, batch: int = TIMER_BATCH) -> int:
    """Fire the timers that are due (by the database's clock) and wake their runs; return how many.

    Several workers may do this at once: on PostgreSQL each takes different timers (SKIP
    LOCKED), on SQLite the transaction serializes them; each timer fires once.
    """
    with transaction.atomic(using=db):
        due = Timer.objects.using(db).filter(status=Timer.Status.PENDING, fire_at__lte=clock.db_now())
        if connections[db].vendor == "postgresql":
            due = due.select_for_update(skip_locked=True, no_key=True)
        rows = list(due.order_by("fire_at").values_list("id", "run_id")[:batch])
        if not rows:
            return 0
        Timer.objects.using(db).filter(id__in=[r[0] for r in rows], status=Timer.Status.PENDING).update(
            status=Timer.Status.FIRED, fired_at=clock.db_now()
        )
        wake([r[1] for r in rows if r[1] is not None], db=db)
    return len(rows)


def next_timer_in(*, db: str) -> float | None:
    """Seconds until the earliest pending timer is due (by the database's clock), or None."""
    from django.db.models import Min

    earliest = Timer.objects.using(db).filter(status=Timer.Status.PENDING).aggregate(at=Min("fire_at"))["at"]
    if earliest is None:
        return None
    if connections[db].vendor == "postgresql" and not clock.is_frozen():
        with connections[db].cursor() as cursor:
            cursor.execute("SELECT EXTRACT(EPOCH FROM %s - statement_timestamp())", [earliest])
            return float(cursor.fetchone()[0])
    return (earliest - clock.now()).total_seconds()


def wake(run_ids, *, db: str) -> int:
    """Make these runs' advance items ready; one being processed is flagged to run again.

    Return how many items there were (a run without one has nothing that could advance it).
    """
    if not isinstance(run_ids, (list, tuple, set)):
        run_ids = [run_ids]
    woken = WorkItem.objects.using(db).filter(run_id__in=run_ids, kind=WorkItem.Kind.ADVANCE).wake()
    notify(db)
    return woken


def announce_end(run_ids, *, db: str) -> None:
    """On PostgreSQL, tell the durable.wait() calls of these runs, if any, that they ended (at commit)."""
    connection = connections[db]
    if connection.vendor == "postgresql" and conf.get("LISTEN_NOTIFY"):
        with connection.cursor() as cursor:
            cursor.execute(queries.ANNOUNCE, [list(run_ids)])


def notify(db: str) -> None:
    """On PostgreSQL, wake idle workers when the current transaction commits (a hint only)."""
    connection = connections[db]
    if connection.vendor == "postgresql" and conf.get("LISTEN_NOTIFY"):
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, '')", [NOTIFY_CHANNEL])


# -- recovery ---------------------------------------------------------------------------------


def reap(*, db: str, batch: int = 100) -> int:
    """Return expired claims to pending, or fail them past DURABLE_MAX_DELIVERIES; return the count.

    Safe to run from every worker at once: rows are locked with SKIP LOCKED on PostgreSQL and
    each UPDATE re-checks that the claim is still expired.
    """
    max_deliveries = int(conf.get("MAX_DELIVERIES"))
    with transaction.atomic(using=db):
        qs = WorkItem.objects.using(db).expired()
        if connections[db].vendor == "postgresql":
            qs = qs.select_for_update(skip_locked=True, no_key=True)
        rows = list(qs.values_list("id", "run_id", "attempts", "claimed_by", "step_key")[:batch])
        if not rows:
            return 0
        if faults.active:
            faults.hit("sweeper_after_select")
        poison = [r for r in rows if r[2] >= max_deliveries]
        again = [r for r in rows if r[2] < max_deliveries]
        if again:
            WorkItem.objects.using(db).expired().filter(id__in=[r[0] for r in again]).requeue(
                last_error="Its worker was lost (it died, or its lease ran out) before it finished; delivered again.",
            )
            WorkflowRun.objects.using(db).filter(id__in=[r[1] for r in again]).back_to_pending()
            notify(db)
        for item_id, run_id, attempts, claimed_by, step_key in poison:
            _fail_poison(db, item_id, run_id, attempts, claimed_by, step_key)
    for _, run_id, attempts, claimed_by, step_key in again:
        logger.warning("Run %s%s: delivery %d of %d after worker %s was lost.", run_id,
                       f" step {step_key!r}" if step_key else "", attempts + 1, max_deliveries, claimed_by or "?")
    return len(rows)


def release_worker(name: str, *, why: str, db: str) -> int:
    """Take back at once the claims of a worker process known to be dead; return how many.

    The supervisor calls this when its child dies: instead of waiting out the leases, the
    claims are expired now and the reaper returns them to the queue (or fails them past
    DURABLE_MAX_DELIVERIES, as a lost lease would), fenced: the claim token changes, so the
    dead process could write nothing even if it were not dead. Its row shows it stopped.
    """
    from ..models import Worker

    with transaction.atomic(using=db):
        claims = WorkItem.objects.using(db).filter(status=Status.PROCESSING, claimed_by=name).update(
            claim_expires_at=None
        )
        Worker.objects.using(db).filter(name=name[:200], stopped_at__isnull=True).update(
            stopped_at=clock.db_now(), current=why[:300]
        )
    if claims:
        reap(db=db, batch=max(claims, 100))  # another worker's reaper may take some first: as good
    return claims


class WorkerLost(Exception):
    """The run's worker died on it too many times (recorded as the run's error)."""


def _fail_poison(db, item_id, run_id, attempts, claimed_by, step_key) -> None:
    if step_key:
        where = f"on step {step_key!r}"
    else:
        last = Step.objects.using(db).filter(run_id=run_id).order_by("-seq").values_list("key", flat=True).first()
        where = f"after step {last!r}" if last else "before its first step"
    message = (
        f"The worker was lost {attempts} times while advancing this run ({where}); the last "
        f"worker was {claimed_by!r}. It ran out of deliveries (DURABLE_MAX_DELIVERIES="
        f"{conf.get('MAX_DELIVERIES')})."
    )
    changed = WorkItem.objects.using(db).expired().filter(id=item_id).free(Status.FAILED, last_error=message)
    run = None
    if changed and run_id is not None:
        # The item is locked (reap()): no worker or operator can end the run meanwhile.
        run = WorkflowRun.objects.using(db).filter(id=run_id).exclude(status__in=WorkflowRun.TERMINAL) \
            .only("pk", "workflow", "parent_id").first()
    if run is not None:
        # Ended as every other ending does (cancelling.end_run): its timers cancelled, its parent
        # woken (it may wait for this child), its waiters told, run_failed (and a task's
        # task_finished) sent after commit; its branches not started and its children with it.
        cancelling.cancel_branches(run.pk, db)
        cancelling.end_run(run, RunStatus.FAILED, serialization.dumps_error(WorkerLost(message)), db,
                           wake_parent=True)
        cancelling.cancel_descendants(cancelling.lock_descendants(run.pk, db),
                                      why=f"Its parent run {run.pk} failed: its worker was lost.", db=db)
    logger.error("Run %s failed: %s", run_id, message)


def held_back(*, queues: list[str] | None, db: str) -> bool:
    """Return True if ready items of limited queues among `queues` (DURABLE_QUEUES) wait for a slot
    or for their rate; False at once when none of them is limited."""
    limits = durable_queues.served(queues)
    if not limits:
        return False
    return WorkItem.objects.using(db).ready([limit.name for limit in limits]).exists()


def pending_work(*, queues: list[str] | None, db: str) -> bool:
    """Return True while work is ready now, claimed by some worker, or due from a timer.

    A burst worker keeps going while this holds.
    """
    items = WorkItem.objects.using(db).filter(
        Q(status=Status.PENDING, available_at__lte=clock.db_now()) | Q(status=Status.PROCESSING)
    )
    if queues:
        items = items.filter(queue__in=queues)
    due = Timer.objects.using(db).filter(status=Timer.Status.PENDING, fire_at__lte=clock.db_now())
    # One statement, so one snapshot: asked one after the other, a claim that expires (processing
    # to pending) or a timer that fires (timer fired, item pending) between two questions would
    # be seen by neither, and a burst worker would leave that work behind.
    (items_sql, items_params), (due_sql, due_params) = (
        qs.values("id")[:1].query.get_compiler(using=db).as_sql() for qs in (items, due)
    )
    with connections[db].cursor() as cursor:
        cursor.execute(f"SELECT EXISTS({items_sql}) OR EXISTS({due_sql})", [*items_params, *due_params])
        return bool(cursor.fetchone()[0])
