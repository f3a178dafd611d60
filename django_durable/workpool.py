"""The workpool: claiming work items, leases, fenced writes, release, wakeups and reaping.

This is the only module that locks rows. Every write a worker makes after a claim is conditioned
on the claim token it got, so a worker that lost its lease (paused, partitioned, too slow) changes
nothing. Times are the database's (see clock.py).
"""

from __future__ import annotations

import datetime as dt
import logging
import time
import uuid
from dataclasses import dataclass, field

from django.db import connections, transaction
from django.db.models import Case, DateTimeField, ExpressionWrapper, F, Value, When
from django.db.models.functions import Coalesce

from . import clock, conf, faults
from .interrupts import LeaseLost
from .models import Step, WorkflowRun, WorkItem

logger = logging.getLogger("django_durable.worker")

NOTIFY_CHANNEL = "durable_work"

Status = WorkItem.Status
RunStatus = WorkflowRun.Status


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
    lost: bool = False
    stopping: bool = field(default=False, repr=False)

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


def lease_seconds() -> float:
    return float(conf.get("LEASE_SECONDS"))


def _lease_margin(lease: float) -> float:
    # The local deadline is counted from before the statement that set the lease, so it
    # already ends no later than the database's; the margin covers clock-rate drift.
    return min(2.0, lease * 0.05)


def _lease_expiry():
    return ExpressionWrapper(
        clock.db_now() + Value(dt.timedelta(seconds=lease_seconds())),
        output_field=DateTimeField(),
    )


def vendor(db: str) -> str:
    return connections[db].vendor


def claim(*, worker: str, queues: list[str] | None, db: str) -> Claim | None:
    """Claim the next ready work item for `worker`; return the Claim or None."""
    token = uuid.uuid4()
    started = time.monotonic()
    if vendor(db) == "postgresql":
        row = _claim_postgres(worker, queues, db, token)
    else:
        row = _claim_compare_and_set(worker, queues, db, token)
    if row is None:
        return None
    item_id, kind, run_id, step_key, attempts = row
    lease = lease_seconds()
    result = Claim(
        item_id=item_id,
        kind=kind,
        run_id=run_id,
        step_key=step_key,
        attempts=attempts,
        token=token,
        worker=worker,
        db=db,
        valid_until=started + lease - _lease_margin(lease),
    )
    if faults.active:
        faults.hit("after_claim_commit")
    return result


def _claim_postgres(worker, queues, db, token):
    # A short transaction: lock one ready row, skipping rows other workers have locked
    # (so claimers never wait on each other), mark it ours, commit. User code runs only
    # after this commit, never while the row lock is held.
    with transaction.atomic(using=db):
        row = (
            WorkItem.objects.using(db)
            .ready(queues)
            .select_for_update(skip_locked=True)
            .values_list("id", "kind", "run_id", "step_key", "attempts")
            .first()
        )
        if row is None:
            return None
        WorkItem.objects.using(db).filter(id=row[0]).update(**_claimed_fields(worker, token))
        _mark_running(row[2], db)
    return row[:4] + (row[4] + 1,)


def _claim_compare_and_set(worker, queues, db, token):
    # SQLite has no row locks: the claim is one UPDATE that only matches a row that is still
    # pending, so of two workers racing for a row exactly one changes it. The token we set
    # tells us which row we got.
    ready_ids = WorkItem.objects.using(db).ready(queues).values("id")[:1]
    changed = (
        WorkItem.objects.using(db)
        .filter(id__in=ready_ids, status=Status.PENDING)
        .update(**_claimed_fields(worker, token))
    )
    if not changed:
        return None
    row = (
        WorkItem.objects.using(db)
        .filter(claim_token=token)
        .values_list("id", "kind", "run_id", "step_key", "attempts")
        .first()
    )
    if row is not None:
        _mark_running(row[2], db)
    return row


def _claimed_fields(worker: str, token: uuid.UUID) -> dict:
    return {
        "status": Status.PROCESSING,
        "claim_token": token,
        "claimed_by": worker[:200],
        "claim_expires_at": _lease_expiry(),
        # Counted at claim, not at completion, so a run that kills its worker every time
        # still runs out of deliveries.
        "attempts": F("attempts") + 1,
        "wake": False,
    }


def _mark_running(run_id, db) -> None:
    if run_id is None:
        return
    WorkflowRun.objects.using(db).filter(
        id=run_id, status__in=[RunStatus.PENDING, RunStatus.WAITING]
    ).update(
        status=RunStatus.RUNNING,
        started_at=Coalesce(F("started_at"), clock.db_now()),
        updated_at=clock.db_now(),
    )


def renew(claim: Claim) -> bool:
    """Extend the lease of `claim`; return False (and mark it lost) if it is no longer ours."""
    if claim.lost:
        return False
    started = time.monotonic()
    if claim.fence().update(claim_expires_at=_lease_expiry()) != 1:
        claim.lost = True
        return False
    lease = lease_seconds()
    claim.valid_until = started + lease - _lease_margin(lease)
    if faults.active:
        faults.hit("after_heartbeat")
    return True


# -- the step journal -------------------------------------------------------------------------

_STEP_COLUMNS = (
    ("run_id", "uuid"),
    ("key", "varchar"),
    ("seq", "integer"),
    ("kind", "varchar"),
    ("name", "varchar"),
    ("status", "varchar"),
    ("result", "text"),
    ("error", "text"),
    ("attempts", "integer"),
    ("started_at", "timestamptz"),
    ("finished_at", "timestamptz"),
)
_STEP_FIELDS = [Step._meta.get_field(name.removesuffix("_id") if name == "run_id" else name)
                for name, _ in _STEP_COLUMNS]
_COLUMN_LIST = ", ".join(f'"{name}"' for name, _ in _STEP_COLUMNS)

# One statement records a step only while the claim holds. On PostgreSQL, FOR SHARE makes a
# concurrent reaper (which rewrites the token) wait for this insert or, if it committed first,
# makes the fence find no row; on SQLite writers are serialized, so the EXISTS is exact.
_INSERT_STEP = {
    "postgresql": (
        "WITH fence AS (SELECT 1 FROM durable_work_item WHERE id = %s AND claim_token = %s "
        "AND status = 'processing' FOR SHARE) "
        f"INSERT INTO durable_step ({_COLUMN_LIST}) SELECT "
        + ", ".join(f"%s::{sqltype}" for _, sqltype in _STEP_COLUMNS)
        + " FROM fence ON CONFLICT (run_id, key) DO NOTHING"
    ),
    "sqlite": (
        f"INSERT INTO durable_step ({_COLUMN_LIST}) SELECT "
        + ", ".join("%s" for _ in _STEP_COLUMNS)
        + " WHERE EXISTS (SELECT 1 FROM durable_work_item WHERE id = %s AND claim_token = %s "
        "AND status = 'processing') ON CONFLICT (run_id, key) DO NOTHING"
    ),
}


@dataclass(frozen=True)
class StepRecord:
    """A journal entry to write: what a step (or a recorded value) produced."""

    key: str
    seq: int
    kind: str
    name: str
    status: str
    result: str | None
    error: str | None
    attempts: int
    started_at: dt.datetime
    finished_at: dt.datetime


def record_step(claim: Claim, record: StepRecord) -> None:
    """Write `record` to the journal if `claim` still holds; raise LeaseLost otherwise.

    One statement; inside an atomic=True step it joins the step's transaction.
    """
    connection = connections[claim.db]
    values = [
        f.get_db_prep_value(v, connection)
        for f, v in zip(
            _STEP_FIELDS,
            (claim.run_id, record.key, record.seq, record.kind, record.name, record.status,
             record.result, record.error, record.attempts, record.started_at, record.finished_at),
        )
    ]
    fence = [claim.item_id, _prep_token(claim.token, connection)]
    kind = connection.vendor
    params = fence + values if kind == "postgresql" else values + fence
    with connection.cursor() as cursor:
        cursor.execute(_INSERT_STEP[kind], params)
        inserted = cursor.rowcount
    if inserted != 1:
        claim.lost = True
        raise LeaseLost(f"step {record.key!r}: claim {claim.token} no longer holds")


def _prep_token(token: uuid.UUID, connection):
    return WorkItem._meta.get_field("claim_token").get_db_prep_value(token, connection)


# -- ending an advance ------------------------------------------------------------------------


def finish_run(claim: Claim, *, status: str, result: str | None, error: str | None) -> bool:
    """Record the run's outcome and free its work item, fenced; return False if the claim is lost."""
    with transaction.atomic(using=claim.db):
        if not _end_claim(claim, next_status=Status.COMPLETED):
            return False
        if faults.active:
            faults.hit("before_terminal_commit")
        now = clock.db_now()
        WorkflowRun.objects.using(claim.db).filter(id=claim.run_id).exclude(
            status__in=WorkflowRun.TERMINAL
        ).update(
            status=status,
            result=result,
            error=error,
            waiting_on="",
            finished_at=now,
            updated_at=now,
        )
    return True


def release(claim: Claim, *, run_status: str, waiting_on: str = "") -> bool:
    """Hand the run back, fenced: it waits (`waiting`) or goes back to the queue (`pending`).

    A waiting run's item goes idle unless a wakeup arrived meanwhile; a pending run's item is
    ready again at once. Return False if the claim was already lost.
    """
    requeue = run_status == RunStatus.PENDING
    with transaction.atomic(using=claim.db):
        next_status = Status.PENDING if requeue else Case(
            When(wake=True, then=Value(Status.PENDING)), default=Value(Status.COMPLETED)
        )
        if not _end_claim(claim, next_status=next_status):
            return False
        WorkflowRun.objects.using(claim.db).filter(
            id=claim.run_id, status=RunStatus.RUNNING
        ).update(status=run_status, waiting_on=waiting_on[:500], updated_at=clock.db_now())
        if requeue:
            notify(claim.db)
    return True


def _end_claim(claim: Claim, *, next_status) -> bool:
    changed = claim.fence().update(
        status=next_status,
        available_at=clock.db_now(),
        claim_token=None,
        claimed_by="",
        claim_expires_at=None,
        attempts=0,
        wake=False,
    )
    if changed != 1:
        claim.lost = True
        return False
    return True


# -- wakeups ----------------------------------------------------------------------------------


def wake(run_id, *, db: str) -> None:
    """Make the run's advance item ready; if it is being processed, flag it to run again."""
    WorkItem.objects.using(db).filter(run_id=run_id, kind=WorkItem.Kind.ADVANCE).update(
        status=Case(When(status=Status.COMPLETED, then=Value(Status.PENDING)), default=F("status")),
        available_at=Case(
            When(status=Status.COMPLETED, then=clock.db_now()), default=F("available_at")
        ),
        wake=Case(When(status=Status.PROCESSING, then=Value(True)), default=F("wake")),
    )
    notify(db)


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
        if vendor(db) == "postgresql":
            qs = qs.select_for_update(skip_locked=True)
        rows = list(qs.values_list("id", "run_id", "attempts", "claimed_by")[:batch])
        if not rows:
            return 0
        if faults.active:
            faults.hit("sweeper_after_select")
        poison = [r for r in rows if r[2] >= max_deliveries]
        again = [r for r in rows if r[2] < max_deliveries]
        expired = WorkItem.objects.using(db).expired()
        if again:
            expired.filter(id__in=[r[0] for r in again]).update(
                status=Status.PENDING,
                claim_token=None,
                claimed_by="",
                claim_expires_at=None,
                available_at=clock.db_now(),
                last_error="The worker's lease expired before it finished; delivered again.",
            )
            WorkflowRun.objects.using(db).filter(
                id__in=[r[1] for r in again], status=RunStatus.RUNNING
            ).update(status=RunStatus.PENDING, updated_at=clock.db_now())
            notify(db)
        for item_id, run_id, attempts, claimed_by in poison:
            _fail_poison(db, item_id, run_id, attempts, claimed_by)
    logger.warning("Returned %d expired claim(s) to the queue, failed %d.", len(again), len(poison))
    return len(rows)


def _fail_poison(db, item_id, run_id, attempts, claimed_by) -> None:
    from . import serialization

    last = (
        Step.objects.using(db).filter(run_id=run_id).order_by("-seq").values_list("key", flat=True)
        .first()
    )
    where = f"after step {last!r}" if last else "before its first step"
    message = (
        f"The worker was lost {attempts} times while advancing this run ({where}); the last "
        f"worker was {claimed_by!r}. It ran out of deliveries (DURABLE_MAX_DELIVERIES="
        f"{conf.get('MAX_DELIVERIES')})."
    )
    changed = WorkItem.objects.using(db).expired().filter(id=item_id).update(
        status=Status.FAILED, claim_token=None, claim_expires_at=None, last_error=message
    )
    if changed and run_id is not None:
        error = serialization.dumps_error(WorkerLost(message))
        WorkflowRun.objects.using(db).filter(id=run_id).exclude(
            status__in=WorkflowRun.TERMINAL
        ).update(status=RunStatus.FAILED, error=error, finished_at=clock.db_now(),
                 updated_at=clock.db_now(), waiting_on="")
    logger.error("Run %s failed: %s", run_id, message)


class WorkerLost(Exception):
    """The run's worker died on it too many times (recorded as the run's error)."""


def pending_work(*, queues: list[str] | None, db: str) -> bool:
    """Return True while work is ready now or claimed by some worker (a burst worker waits)."""
    qs = WorkItem.objects.using(db)
    if queues:
        qs = qs.filter(queue__in=queues)
    ready = qs.filter(status=Status.PENDING, available_at__lte=clock.db_now())
    return ready.exists() or qs.filter(status=Status.PROCESSING).exists()
