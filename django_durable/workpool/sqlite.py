"""The workpool's hot path on SQLite, the embedded development database.

SQLite has no row locks and one writer at a time: a claim is a compare-and-set UPDATE that only
matches a row still pending, and fenced writes check the claim token in the same statement or in
the same IMMEDIATE transaction, which no other writer can interleave with.
"""

from __future__ import annotations

import datetime as dt
import uuid
from contextlib import nullcontext
from typing import TYPE_CHECKING

from django.db import connections, transaction
from django.db.models import Case, DateTimeField, ExpressionWrapper, F, TextField, Value, When
from django.db.models.functions import Cast

from .. import clock
from .. import queues as durable_queues
from ..journal import STEP_COLUMNS, UPSERT
from ..models import QueueState, SignalMessage, Step, Timer, WorkflowRun, WorkItem
from ..models.pool import PENDING_UNSEEN
from . import endings
from .leases import lease_expiry
from .rows import Child, ClaimParams, Claimed, Entry, Message, Place, RunState
from .wakeups import wake

if TYPE_CHECKING:
    from ..journal import StepRecord
    from .holds import Claim, Ending

# A claim's clock is this machine's, read after the claim: exact (backend.Backend.CLOCK_AT_SEND).
CLOCK_AT_SEND = False

_STEP_FIELDS = [Step._meta.get_field(name.removesuffix("_id")) for name, _ in STEP_COLUMNS]
_COLUMN_NAMES = ", ".join(f'"{f.column}"' for f in _STEP_FIELDS)
_ROW = "(" + ", ".join("%s" for _ in _STEP_FIELDS) + ")"


def batches(db: str, queues: list[str] | None) -> bool:
    """Never: one writer at a time gains nothing from claiming ahead (the batch verbs below serve
    the contract, each a loop of the single verb in one transaction)."""
    return False


def claim_many(params: ClaimParams, tokens: list[uuid.UUID]) -> list[tuple[Claimed, uuid.UUID]]:
    """claim() once per token, in one transaction, leaving the runs as they were (as
    queries.CLAIM_MANY); (the claim, its token) each, in claim order."""
    claimed = []
    with transaction.atomic(using=params.db):
        for token in tokens:
            row = _claim(params._replace(token=token), mark=False)
            if row is None:
                break
            claimed.append((row, token))
    return claimed


def finish_runs(endings: list[Ending]) -> dict[int, str]:
    """finish_run() of each completion, in one transaction; {item id: how its run ended}, the
    items whose claim was lost left out."""
    ended = {}
    with transaction.atomic(using=endings[0].claim.db):
        for ending in endings:
            final, _ = finish_run(ending.claim, status=WorkflowRun.Status.COMPLETED, result=ending.result, error=None,
                                  records=ending.records)
            if final is not None:
                ended[ending.claim.item_id] = final
    return ended


def claim(params: ClaimParams) -> Claimed | None:
    limits = durable_queues.served(params.queues)
    if not limits:
        return _claim(params)
    # A limited queue's claim counts what runs and takes a slot in one IMMEDIATE transaction:
    # SQLite's one writer at a time makes that race-free across worker processes.
    with transaction.atomic(using=params.db):
        claimed = _claim(params, limits=limits)
        if claimed is not None:
            _rated(claimed.item_id, limits, params.db)
        return claimed


def _rated(item_id, limits, db) -> None:
    """The claimed item's queue, if it has a rate limit, may be claimed again one interval from now."""
    queue = WorkItem.objects.using(db).filter(id=item_id).values_list("queue", flat=True).get()
    limit = next((limit for limit in limits if limit.name == queue and limit.rate is not None), None)
    if limit is not None:
        from datetime import timedelta

        QueueState.objects.using(db).update_or_create(
            name=queue, defaults={"next_claim_at": ExpressionWrapper(
                clock.db_now() + Value(timedelta(seconds=limit.interval)), output_field=DateTimeField())},
        )


def _claim(params: ClaimParams, limits=(), mark: bool = True) -> Claimed | None:
    db, worker = params.db, params.worker
    # Compare-and-set: the UPDATE only matches the row while it is still pending, so of two
    # workers racing for a row exactly one changes it; the other tries the next row.
    for _ in range(3):
        candidate = WorkItem.objects.using(db).ready(params.queues, params.avoid, limits, floor=params.floor) \
            .values_list("id", flat=True).first()
        if candidate is None:
            return None
        changed = WorkItem.objects.using(db).filter(id=candidate, status=WorkItem.Status.PENDING).take(
            token=params.token, worker=worker, lease_expires=lease_expiry())
        if changed:
            break
    else:
        return None
    item_id, kind, run_id, step_key, attempts, function, item_input, group, priority, available_at = (
        WorkItem.objects.using(db)
        .filter(id=candidate)
        # available_at as stored, text: the floor compares it as the claim order sorts it (Place)
        .values_list("id", "kind", "run_id", "step_key", "attempts", "function", "input", "group", "priority",
                     Cast("available_at", TextField()))
        .get()
    )
    run = None
    if run_id is not None:
        runs = WorkflowRun.objects.using(db).filter(id=run_id).unfinished()
        if kind == WorkItem.Kind.ADVANCE and mark:
            runs.mark_running(worker)  # a branch (a step item) leaves its run waiting
        state = runs.values("workflow", "input", "attempt", "max_attempts", "deadline_at", "cancel_requested_at").first()
        if state is not None:
            journal, messages, children = [], [], []
            steps = Step.objects.using(db).filter(run_id=run_id)
            if kind != WorkItem.Kind.ADVANCE:
                steps = steps.filter(key=step_key)  # a branch reads its own entry
            journal = [Entry._make(entry) for entry in steps.values_list(*Entry._fields)]
            if kind == WorkItem.Kind.ADVANCE:
                messages = [Message._make(message) for message in (
                    SignalMessage.objects.using(db)
                    .filter(run_id=run_id, consumed_at__isnull=True)
                    .order_by("id")
                    .values_list(*Message._fields)
                )]
                children = [Child._make(child) for child in (
                    WorkflowRun.objects.using(db)
                    .filter(parent_id=run_id, status__in=WorkflowRun.TERMINAL)
                    .values_list(*Child._fields)
                )]
            run = RunState(state["workflow"], state["input"], state["attempt"], state["max_attempts"],
                           state["deadline_at"], state["cancel_requested_at"] is not None, journal, messages, children)
    # SQLite's clock is this machine's clock.
    return Claimed(item_id, kind, run_id, step_key, attempts, clock.now(), run, function, item_input, group,
                   Place(priority, available_at, item_id))


def _params(claim, records, connection) -> list:
    params = []
    for record in records:
        values = (claim.run_id, *record.values)
        params.extend(f.get_db_prep_value(v, connection) for f, v in zip(_STEP_FIELDS, values))
    return params


def record_steps(claim: Claim, records: list[StepRecord]) -> tuple[int, bool]:
    connection = connections[claim.db]
    params = _params(claim, records, connection)
    token = WorkItem._meta.get_field("claim_token").get_db_prep_value(claim.token, connection)
    run_id = WorkflowRun._meta.pk.get_db_prep_value(claim.run_id, connection)
    sql = (
        f"INSERT INTO durable_step ({_COLUMN_NAMES}) SELECT * FROM (VALUES {', '.join([_ROW] * len(records))}) "
        "WHERE EXISTS (SELECT 1 FROM durable_work_item WHERE id = %s AND claim_token = %s "
        f"AND status = 'processing') {UPSERT} "
        "RETURNING (SELECT cancel_requested_at IS NOT NULL FROM durable_workflow_run WHERE id = %s)"
    )
    consumes = any(record.consumes is not None for record in records)
    # A consumed message is marked in the same transaction as the entry that returns it.
    with transaction.atomic(using=claim.db) if consumes else nullcontext():
        with connection.cursor() as cursor:
            cursor.execute(sql, [*params, claim.item_id, token, run_id])
            rows = cursor.fetchall()
        if rows and consumes:
            _consume(claim, records)
    return len(rows), any(row[0] for row in rows)


def _consume(claim, records) -> None:
    """Mark consumed the messages the entries take; the timeouts of the waits they answer never
    fire (in SQL: queries.CONSUMED)."""
    for record in records:
        if record.consumes is not None:
            if SignalMessage.objects.using(claim.db).filter(id=record.consumes, consumed_at__isnull=True).update(
                    consumed_at=clock.db_now(), consumed_by=record.key):
                Timer.objects.using(claim.db).filter(
                    run_id=claim.run_id, step_key=record.key, kind=Timer.Kind.SIGNAL_TIMEOUT,
                    status=PENDING_UNSEEN).update(status=Timer.Status.CANCELLED)


def _end(claim, item_status, records, timers=(), items=(), available_at=None) -> bool:
    """The fence: the item ends with `item_status`, or with None (the run's end) is deleted
    (queries.END_FENCE, END_FENCE_DROP); then the entries, messages, branches and timers."""
    fence = claim.fence()
    if item_status is None:
        held = fence.drop()
    else:
        held = fence.end(item_status, **({"available_at": available_at} if available_at else {}))
    if not held:
        return False
    if records:
        # The claim token is gone now, so the journal rows are written unfenced, inside the
        # transaction whose fence just held.
        connection = connections[claim.db]
        params = _params(claim, records, connection)
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO durable_step ({_COLUMN_NAMES}) VALUES {', '.join([_ROW] * len(records))} {UPSERT}",
                params,
            )
    _consume(claim, records)
    if items:
        run = WorkflowRun.objects.using(claim.db).values("queue", "priority", "concurrency_key").get(id=claim.run_id)
        turn = None if durable_queues.fair(run["queue"]) is None else \
            WorkItem.objects.using(claim.db).values_list("turn", flat=True).get(id=claim.item_id)  # fairness.py
        WorkItem.objects.using(claim.db).bulk_create(
            WorkItem(kind=WorkItem.Kind.STEP, run_id=claim.run_id, step_key=key, group=group, function=function,
                     input=text, available_at=turn or clock.db_now(), turn=turn, **run)
            for key, group, function, text in items
        )
    Timer.objects.using(claim.db).bulk_create(
        Timer(kind=kind, run_id=claim.run_id, step_key=key, fire_at=fire_at) for kind, key, fire_at in timers
    )
    return True


def finish_run(claim: Claim, *, status: str, result: str | None, error: str | None, records: list[StepRecord],
               next_claim: ClaimParams | None = None) -> tuple[str | None, Claimed | None]:
    """As on PostgreSQL: the fence, which deletes the item, then the run's end (endings.record_end,
    whose SQL twin queries.FINISH_RUN is); `next_claim` is ignored (the worker claims next with a
    statement of its own)."""
    with transaction.atomic(using=claim.db):
        if not _end(claim, None, records):
            return None, None
        ended = endings.record_end(claim.run_id, status, db=claim.db, result=result, error=error, cancel_wins=True,
                                   **claim.claimed_fields())
    return (ended.status if ended is not None else endings.UNCHANGED), None


def release(claim: Claim, *, run_status: str, waiting_on: str, requeue: bool, records: list[StepRecord],
            timers: list[tuple[str, str, dt.datetime]], items: list[tuple[str, str, str, str]], notify: bool,
            next_claim: ClaimParams | None = None) -> tuple[bool, Claimed | None]:
    item_status = WorkItem.Status.PENDING if requeue else Case(
        When(wake=True, then=Value(WorkItem.Status.PENDING)), default=Value(WorkItem.Status.COMPLETED)
    )
    with transaction.atomic(using=claim.db):
        if not _end(claim, item_status, records, timers, items):
            return False, None
        WorkflowRun.objects.using(claim.db).filter(id=claim.run_id, status__in=WorkflowRun.ADVANCING).update(
            status=run_status, waiting_on=waiting_on, updated_at=clock.db_now(), **claim.claimed_fields()
        )
    return True, None


def finish_branch(claim: Claim, record: StepRecord, *, group: str, failed: bool, fail_fast: bool,
                  next_claim: ClaimParams | None = None) -> tuple[bool, Claimed | None]:
    """As on PostgreSQL; SQLite's single writer makes the group's count exact."""
    with transaction.atomic(using=claim.db):
        if not _end(claim, WorkItem.Status.COMPLETED, [record]):
            return False, None
        steps = Step.objects.using(claim.db).filter(run_id=claim.run_id, key=group)
        steps.update(remaining=F("remaining") - 1)
        if failed and fail_fast:
            endings.cancel_branches(claim.run_id, claim.db, group=group)
        if (failed and fail_fast) or steps.filter(remaining__lte=0).exists():
            wake([claim.run_id], db=claim.db)
    return True, None


def retry_branch(claim: Claim, record: StepRecord, *, retry_at: dt.datetime,
                 next_claim: ClaimParams | None = None) -> tuple[bool, Claimed | None]:
    with transaction.atomic(using=claim.db):
        return _end(claim, WorkItem.Status.PENDING, [record], available_at=retry_at), None
