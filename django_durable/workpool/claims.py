"""Every write a worker makes under a claim (claiming.py takes it), fenced by its token.

Every write a worker makes after a claim is conditioned on the claim's token, so a worker that
lost its lease (paused, partitioned, too slow) changes nothing. The hot path has one
implementation per database, each whole, reached through backend.of() (the contract is
backend.Backend): ``postgres`` does each write in a single statement, ``sqlite`` with
compare-and-set updates in an IMMEDIATE transaction. A run's end goes through endings.py, which
both share.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable
from enum import StrEnum

from django.db import DatabaseError, connections, transaction
from django.db.models import DateTimeField, ExpressionWrapper, F, Value
from django.db.models.functions import Coalesce

from .. import clock, conf, faults
from ..interrupts import LeaseLost
from ..journal import StepRecord
from ..models import Step, Timer, WorkflowEvent, WorkflowRun, WorkItem
from . import backend, endings, evidence, locking
from .claiming import ClaimRequest, claimed
from .holds import Claim, Ending
from .leases import lease_expiry, valid_until
from .rows import ClaimParams

logger = logging.getLogger("django_durable.worker")

Status = WorkItem.Status
RunStatus = WorkflowRun.Status


class Outcome(StrEnum):
    """What became of a claimed item: the engine answers one, the worker acts on LOST and DEFERRED."""

    # The run (or the branch) ended so.
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    COMPENSATION_FAILED = "compensation_failed"
    # The run waits (a timer, a message, its branches or children), or is held for an operator.
    WAITING = "waiting"
    BLOCKED = "blocked"
    PAUSED = "paused"
    RETRYING = "retrying"  # the run, or the branch, goes again after a back-off
    RELEASED = "released"  # handed back, ready at once (the worker is stopping)
    DEFERRED = "deferred"  # handed back for a worker that has its code
    MISSING = "missing"  # workers lacked its code for longer than the grace: the caller fails it
    REPLAYED = "replayed"  # a branch whose outcome an earlier attempt of its run recorded
    ALREADY_FINISHED = "already finished"  # its run ended before the claim: the item is freed
    LOST = "lost"  # the claim was lost: nothing was written

    @classmethod
    def of(cls, value: str) -> Outcome:
        """The outcome named `value` (a run's terminal status, say), without Enum's slower call."""
        return cls._value2member_map_[value]


def record_steps(claim: Claim, records: list[StepRecord]) -> None:
    """Write `records` to the journal if `claim` still holds; raise LeaseLost otherwise.

    One statement; inside an atomic=True step it joins the step's transaction.
    """
    if not records:
        return
    written, cancel = backend.of(claim.db).record_steps(claim, records)
    if written != len(records):
        claim.lost = True
        raise LeaseLost(f"claim {claim.token} no longer holds; {records[0].key!r} not recorded")
    claim.cancel_requested = claim.cancel_requested or cancel


def finish_run(claim: Claim, *, status: str, result: str | None, error: str | None,
               records: list[StepRecord] = (), then: ClaimRequest | None = None,
               committed: Callable[[], None] | None = None) -> str | None:
    """Record the last journal entries and the run's outcome, and delete its work item: the run's
    end (endings.py) made by its worker.

    Fenced and atomic. Return the status the run ended with (``cancelled`` when a cancel
    committed first), endings.UNCHANGED for a run that had ended before (only its item is deleted),
    or None (writing nothing) if the claim is lost. With `then`, the same statement claims the
    worker's next item, left in ``claim.next_claim`` (PostgreSQL). Once the end has committed,
    `committed()` is called (the engine announces the steps `records` holds) and then the end's
    signal is sent.
    """
    if faults.active:
        faults.hit("before_terminal_commit")
    if claim.batch is not None and status == RunStatus.COMPLETED and then is None:
        # Written with the batch's other completions by finish_runs(), signal and all.
        claim.batch.append(Ending(claim, result, list(records), committed))
        return status

    def end(next_claim: ClaimParams | None):
        return backend.of(claim.db).finish_run(claim, status=status, result=result, error=error,
                                             records=list(records), next_claim=next_claim)

    if status == RunStatus.COMPLETED:
        final = _ending(claim, then, end)
    else:
        # Any other ending takes the run's unfinished children with it, in the same transaction:
        # nothing would wait for them any more. Rare, so no chained claim: a claim made inside a
        # transaction that then fails to commit would not exist.
        with transaction.atomic(using=claim.db):
            descendants = locking.lock_descendants(claim.run_id, claim.db)
            final = _ending(claim, None, end)
            if final and final != endings.UNCHANGED:
                endings.cascade(claim.run_id, final, descendants, db=claim.db)
    if not final:
        return None
    if faults.active:
        faults.hit("after_terminal_commit")
    if committed is not None:
        committed()
    if final != endings.UNCHANGED:
        # Committed: in autocommit, or by the block above. A cancel that committed first (the run
        # ended otherwise than asked) carries no result or error of this end.
        asked = final == status
        endings.send_end(endings.Ended(claim.run_id, claim.run.workflow, final, result if asked else None,
                                       error if asked else None))
    return final


def finish_runs(batch: list[Ending]) -> list[tuple[Ending, str | None]]:
    """Write the completions of a batch in one statement, each fenced by its own claim, as
    finish_run() writes one; return each with the status its run ended with (``cancelled`` when a
    cancel committed first, endings.UNCHANGED if it had ended before, None if its claim was lost).
    Once committed, each one's `committed()` is called and its end's signal sent."""
    finals = write_endings(batch)
    announce_endings(finals)
    return finals


def write_endings(batch: list[Ending]) -> list[tuple[Ending, str | None]]:
    """finish_runs() without what follows the commit (announce_endings(), which runs user code):
    what a worker's maintenance thread writes of a batch while the item in flight runs long."""
    if not batch:
        return []
    for ending in batch:
        ending.claim.ending = True
    ended = backend.of(batch[0].claim.db).finish_runs(batch)
    if faults.active:
        faults.hit("after_terminal_commit")
    finals = []
    for ending in batch:
        final = ended.get(ending.claim.item_id)
        if final is None:
            ending.claim.lost = True
        finals.append((ending, final))
    return finals


def announce_endings(finals: list[tuple[Ending, str | None]]) -> None:
    """After the commit of write_endings(): each written ending's `committed()`, then its end's signal."""
    for ending, final in finals:
        if final is None:
            continue
        claim = ending.claim
        if ending.committed is not None:
            ending.committed()
        if final != endings.UNCHANGED:
            asked = final == RunStatus.COMPLETED
            endings.send_end(endings.Ended(claim.run_id, claim.run.workflow, final,
                                           ending.result if asked else None, None))


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
    held = _ending(claim, then, lambda next_claim: backend.of(claim.db).release(
        claim, run_status=run_status, waiting_on=waiting_on[:500], requeue=requeue, records=list(records),
        timers=list(timers), items=list(items), notify=requeue and conf.get("LISTEN_NOTIFY"), next_claim=next_claim,
    ))
    if held and timers:
        claim.earliest_timer = min(fire_at for _, _, fire_at in timers)
    return bool(held)


def ended_by_itself(claim: Claim) -> bool:
    """Whether `claim`'s item was ended by the claim's own end: what a worker finds when that end
    committed but the database's answer never came (a connection cut after COMMIT, a failover).
    Read after a hand-back that found the claim gone. The item is held by no claim and its delivery
    count is reset (an end does that; the reaper's taking back and its failing a run for good keep
    it), or it is gone and its run ended (a run's end deletes its advance item), and nothing took
    the item from this worker since the claim began (WorkflowEvent.TAKES_CLAIM: a reaped item ended
    later by another worker is reset too)."""
    item = WorkItem.objects.using(claim.db).filter(pk=claim.item_id).values_list("claim_token", "attempts").first()
    if item is None:
        if not WorkflowRun.objects.using(claim.db).filter(pk=claim.run_id, status__in=WorkflowRun.TERMINAL).exists():
            return False
    elif item != (None, 0):
        return False
    taken = WorkflowEvent.objects.using(claim.db).filter(run_id=claim.run_id, type__in=WorkflowEvent.TAKES_CLAIM)
    if claim.db_time is not None:
        taken = taken.filter(at__gte=claim.db_time)
    return not taken.exists()


def finish_branch(claim: Claim, record: StepRecord, *, failed: bool, fail_fast: bool,
                  then: ClaimRequest | None = None) -> bool:
    """Record a branch's outcome and count it off its group (waking the run when it is done); fenced."""
    return bool(_ending(claim, then, lambda next_claim: backend.of(claim.db).finish_branch(
        claim, record, group=claim.group, failed=failed, fail_fast=fail_fast, next_claim=next_claim
    )))


def retry_branch(claim: Claim, record: StepRecord, *, retry_at: dt.datetime,
                 then: ClaimRequest | None = None) -> bool:
    """Record a branch's failed attempt and queue it again for `retry_at`; fenced."""
    return bool(_ending(claim, then, lambda next_claim: backend.of(claim.db).retry_branch(
        claim, record, retry_at=retry_at, next_claim=next_claim
    )))


def _ending(claim: Claim, then: ClaimRequest | None, end):
    """Run `end(next_claim)`, which returns (outcome, the next claim's Claimed or None); keep the
    next claim in ``claim.next_claim`` and return the outcome.

    A falsy outcome means the fence did not hold: the claim is lost.
    """
    outcome = {}
    claim.ending = True

    def send(next_claim: ClaimParams | None):
        outcome["value"], row = end(next_claim)
        return row

    claim.next_claim = claimed(claim.db, then, send)
    if not outcome["value"]:
        claim.lost = True
    return outcome["value"]


def renew(claim: Claim) -> bool:
    """Extend the lease of `claim`; return False (and mark it lost) if it is no longer ours."""
    if claim.lost:
        return False
    started = time.monotonic()
    if claim.fence().update(claim_expires_at=lease_expiry()) != 1:
        if not claim.ending:  # else the end decides: it committed, or it finds the claim lost
            claim.lost = True
        return False
    claim.valid_until = valid_until(started)
    check_cancel(claim)
    if faults.active:
        faults.hit("after_heartbeat")
    return True


def mark_running(claim: Claim) -> None:
    """Write `running` on the run of `claim`, an advance taken in a batch (which left its run as it
    was) whose turn is still going after a moment, as a claim of one item writes it at once, with
    who claimed it and when. Fenced: the item is locked first, as a journal write locks it, so an
    end of the turn committed meanwhile leaves nothing to mark, and one coming waits for this.
    A run a cancel or an operator ended or held meanwhile keeps its status."""
    if claim.marked or claim.lost or claim.ending or claim.run_id is None:
        return
    with transaction.atomic(using=claim.db):
        if list(claim.fence().select_for_update(no_key=True).values_list("id", flat=True)):
            WorkflowRun.objects.using(claim.db).filter(
                id=claim.run_id, status__in=[RunStatus.PENDING, RunStatus.WAITING]
            ).mark_running(claim.worker[:200], claim.db_time)
    claim.marked = True


def check_cancel(claim: Claim) -> bool:
    """Return whether someone asked to cancel the claim's run, learning it from the database once."""
    if claim.run_id is not None and not claim.cancel_requested:
        claim.cancel_requested = WorkflowRun.objects.using(claim.db).filter(
            id=claim.run_id, cancel_requested_at__isnull=False
        ).exists()
    return claim.cancel_requested


def note_step(claim: Claim, key: str) -> None:
    """Note on the run's work item the step a redelivered advance is starting (fenced)."""
    if claim.fence().update(step_key=key[:255]) != 1:
        claim.lost = True
        raise LeaseLost(f"claim {claim.token} no longer holds; step {key!r} not started")


def recorded(claim: Claim, records: list[StepRecord]) -> bool:
    """Return True if `records` are in the journal as written: a commit whose answer was lost.

    Reads on a fresh connection; any database error means "not known to be recorded".
    """
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


def defer_missing(claim: Claim, what: str) -> Outcome:
    """Hand back an item whose code (`what`) this worker lacks, for a worker that has it; fenced.

    Not counted as a delivery: a worker of the old code during a rolling deploy is not a crash.
    The item comes back after a short delay, so a worker without the code does not spin on it.
    Return DEFERRED; MISSING (writing nothing) once workers have lacked it for
    DURABLE_MISSING_CODE_GRACE_SECONDS, so the caller fails it; or LOST.
    """
    grace = float(conf.get("MISSING_CODE_GRACE_SECONDS"))
    if grace <= 0:
        return Outcome.MISSING  # the caller's fenced failure finds out if the claim is lost
    delay = dt.timedelta(seconds=missing_code_delay())
    now = clock.db_now()
    since = ExpressionWrapper(now - Value(dt.timedelta(seconds=grace)), output_field=DateTimeField())
    claim.ending = True
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
                return Outcome.MISSING
            claim.lost = True
            return Outcome.LOST
        if claim.kind == WorkItem.Kind.ADVANCE:
            WorkflowRun.objects.using(claim.db).filter(id=claim.run_id).back_to_pending(
                waiting_on=f"a worker that has {what}"[:500], from_statuses=WorkflowRun.ADVANCING)
    logger.warning("Worker %s does not have %s (run %s); left for a worker that has it.",
                   claim.worker, what, claim.run_id)
    return Outcome.DEFERRED


def retry_run(claim: Claim, *, retry_at: dt.datetime, error: str, records: list[StepRecord], waiting_on: str) -> bool:
    """Schedule the run to go again from its last checkpoint at `retry_at`, fenced.

    Its failed steps are forgotten (they run again), its attempt is counted, and a timer wakes
    it. Return False (writing nothing) if the claim is lost.
    """
    record_steps(claim, records)
    claim.ending = True
    with transaction.atomic(using=claim.db):
        if not claim.fence().end(Status.COMPLETED, step_key=""):
            claim.lost = True
            return False
        evidence.keep(claim.run_id, attempt=claim.run.attempt, status=RunStatus.FAILED, error=error,
                      worker=claim.worker, db=claim.db)
        Step.objects.using(claim.db).filter(run_id=claim.run_id, status=Step.Status.FAILED).delete()
        WorkflowRun.objects.using(claim.db).filter(id=claim.run_id).update(
            status=RunStatus.WAITING, attempt=F("attempt") + 1, error=error, waiting_on=waiting_on[:500],
            updated_at=clock.db_now(), **claim.claimed_fields(),
        )
        Timer.objects.using(claim.db).create(kind=Timer.Kind.RETRY, run_id=claim.run_id, fire_at=retry_at)
    return True
