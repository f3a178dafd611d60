"""Recovery: claims whose lease ran out go back to the queue, or end the run past its deliveries.

Recovery runs in every worker's maintenance thread, is never a queued job, and is safe to run
from every worker at once: rows are locked with SKIP LOCKED on PostgreSQL and every write
re-checks that the claim is still expired.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Coalesce

from .. import clock, conf, faults, serialization
from ..models import Step, WorkflowEvent, WorkflowRun, WorkItem
from . import endings, locking
from .wakeups import notify

logger = logging.getLogger("django_durable.worker")

Status = WorkItem.Status
PROCESS_GONE = "died: its process"  # how a neighbour's account of a dead worker begins


class Expired(NamedTuple):
    """A claim whose lease ran out, as the reaper reads it."""

    item_id: int
    run_id: object
    attempts: int
    claimed_by: str
    step_key: str


def reap(*, db: str, batch: int = 100) -> int:
    """Return expired claims to pending, or fail their runs past DURABLE_MAX_DELIVERIES; return the count."""
    max_deliveries = int(conf.get("MAX_DELIVERIES"))
    with transaction.atomic(using=db):
        qs = WorkItem.objects.using(db).expired()
        if conf.is_postgres(db):
            qs = qs.select_for_update(skip_locked=True, no_key=True)
        rows = [Expired._make(row) for row in qs.values_list("id", *Expired._fields[1:])[:batch]]
        if not rows:
            return 0
        if faults.active:
            faults.hit("sweeper_after_select")
        again = [row for row in rows if row.attempts < max_deliveries]
        if again:
            WorkItem.objects.using(db).expired().filter(id__in=[row.item_id for row in again]).requeue(
                last_error="Its worker was lost (it died, or its lease ran out) before it finished; delivered again.",
            )
            WorkflowRun.objects.using(db).filter(id__in=[row.run_id for row in again]).back_to_pending()
            # The trail keeps who had it (a task's worker_ids and attempts count the lost one).
            WorkflowEvent.objects.using(db).bulk_create([
                WorkflowEvent(run_id=row.run_id, type=WorkflowEvent.Type.WORKER_LOST,
                              message=f"Worker {row.claimed_by or '?'} was lost; delivery {row.attempts + 1} of "
                                      f"{max_deliveries} follows.",
                              data={"worker": row.claimed_by, "delivery": row.attempts,
                                    **({"step": row.step_key} if row.step_key else {})})
                for row in again if row.run_id is not None
            ])
            notify(db)
    for row in again:
        logger.warning("Run %s%s: delivery %d of %d after worker %s was lost.", row.run_id,
                       f" step {row.step_key!r}" if row.step_key else "", row.attempts + 1, max_deliveries,
                       row.claimed_by or "?")
    for row in rows:
        if row.attempts >= max_deliveries:
            _fail_poison(row, db)
    return len(rows)


def release_worker(name: str, *, why: str, db: str, witnessed: bool = False) -> int:
    """Take back at once the claims of a worker process known to be dead; return how many.

    The supervisor calls this when its child dies: instead of waiting out the leases, the
    claims are expired now and the reaper returns them to the queue (or fails them past
    DURABLE_MAX_DELIVERIES, as a lost lease would), fenced: the claim token changes, so the
    dead process could write nothing even if it were not dead. Its row shows it stopped, and
    why. A neighbour that found the process gone (`release_dead_neighbours`) can only say so;
    the supervisor, which read the exit status (`witnessed`), says how it died, even after.
    """
    from ..models import Worker

    stopped = Q(stopped_at__isnull=True)
    if witnessed:
        stopped |= Q(current__startswith=PROCESS_GONE)
    with transaction.atomic(using=db):
        claims = WorkItem.objects.using(db).filter(status=Status.PROCESSING, claimed_by=name).update(
            claim_expires_at=None
        )
        Worker.objects.using(db).filter(stopped, name=name[:200]).update(
            stopped_at=Coalesce("stopped_at", clock.db_now()), current=why[:300]
        )
    if claims:
        reap(db=db, batch=max(claims, 100))  # another worker's reaper may take some first: as good
    return claims


class WorkerLost(Exception):
    """The run's worker died on it too many times (recorded as the run's error)."""


def _fail_poison(row: Expired, db: str) -> None:
    """End the run of an item its workers died on DURABLE_MAX_DELIVERIES times, failed, as every
    run ends (endings.end_run), in a transaction of its own that locks its descendants first (the
    workers' lock order) and then finds the item still expired: of two reapers, one fails it."""
    if row.step_key:
        where = f"on step {row.step_key!r}"
    else:
        last = Step.objects.using(db).filter(run_id=row.run_id).order_by("-seq").values_list("key", flat=True).first()
        where = f"after step {last!r}" if last else "before its first step"
    message = (
        f"The worker was lost {row.attempts} times while advancing this run ({where}); the last "
        f"worker was {row.claimed_by!r}. It ran out of deliveries (DURABLE_MAX_DELIVERIES="
        f"{conf.get('MAX_DELIVERIES')})."
    )
    with transaction.atomic(using=db):
        descendants = locking.lock_descendants(row.run_id, db) if row.run_id is not None else []
        item = WorkItem.objects.using(db).expired().filter(id=row.item_id, attempts__gte=row.attempts)
        if not list(item.select_for_update(no_key=True).values_list("id", flat=True)):
            return  # another reaper, or a worker's late write, took it first
        item.free(Status.FAILED, last_error=message)
        if row.run_id is not None:
            endings.end_run(row.run_id, WorkflowRun.Status.FAILED, db=db, descendants=descendants,
                            error=serialization.dumps_error(WorkerLost(message)))
    logger.error("Run %s failed: %s", row.run_id, message)
