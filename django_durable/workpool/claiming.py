"""Taking work: a worker's claim of one ready item or of several, and a claim given back unused.

A claim locks the next ready item (SKIP LOCKED on PostgreSQL, a compare-and-set on SQLite), gives
it a fresh token and lease, counts the delivery and marks an advanced run running, in one short
transaction; the backend (backend.of()) does it. Every write under the claim is claims.py's.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from django.db import transaction
from django.db.models import F

from .. import faults
from ..models import WorkflowRun, WorkItem
from . import backend
from .holds import Claim
from .leases import lease_seconds, valid_until
from .rows import ClaimParams, Claimed

Status = WorkItem.Status


@dataclass(frozen=True)
class ClaimRequest:
    """What a worker asks for when it claims: who it is, which queues it serves, and the items it
    just declined for lack of their code (`avoid`: the workers that have it go first)."""

    worker: str
    queues: list[str] | None
    avoid: tuple[int, ...] = ()


def claim(*, worker: str, queues: list[str] | None, db: str, avoid: tuple[int, ...] = ()) -> Claim | None:
    """Claim the next ready work item for `worker` (not one in `avoid`); return the Claim (with its run) or None."""
    return claimed(db, ClaimRequest(worker, queues, avoid), backend.of(db).claim)


def batches(db: str, queues: list[str] | None) -> bool:
    """Whether the worker claims and completes in batches here (claim_many(), finish_runs()):
    PostgreSQL, plain tables, a worker of every queue or of one, none of them limited."""
    return backend.of(db).batches(db, queues)


def claim_many(*, worker: str, queues: list[str] | None, db: str, k: int) -> list[Claim]:
    """Claim up to `k` ready work items for `worker` at once (on PostgreSQL in one statement), each
    with its own token and lease, as claim() would one after the other."""
    tokens = [uuid.uuid4() for _ in range(k)]
    started = time.monotonic()
    rows = backend.of(db).claim_many(ClaimParams(worker[:200], queues, db, tokens[0], lease_seconds()), tokens)
    answered = time.monotonic()
    return [_claim_of(row, token, worker, db, started, answered) for row, token in rows]


def unclaim(claims: list[Claim]) -> int:
    """Give back claims taken ahead and never started (a batch's), fenced each, as if never made:
    each item ready again in its place (its available_at unchanged) and not counted as a
    delivery, its run pending again. Return how many were still held."""
    if not claims:
        return 0
    db = claims[0].db
    held = 0
    with transaction.atomic(using=db):
        for claim in claims:
            if claim.fence().free(Status.PENDING, attempts=F("attempts") - 1):
                held += 1
                WorkflowRun.objects.using(db).filter(pk=claim.run_id).back_to_pending()
            claim.lost = True  # (it is not ours any more, whichever way)
    return held


def claimed(db: str, request: ClaimRequest | None, send) -> Claim | None:
    """Call `send` with the ClaimParams of a claim for `request` (None: no claim asked for); turn
    the Claimed it answers into a Claim."""
    if request is None:
        send(None)
        return None
    token = uuid.uuid4()
    started = time.monotonic()
    row = send(ClaimParams(request.worker[:200], request.queues, db, token, lease_seconds(), request.avoid))
    if row is None:
        return None
    return _claim_of(row, token, request.worker, db, started, time.monotonic())


def _claim_of(row: Claimed, token, worker: str, db: str, started: float, answered: float) -> Claim:
    """The Claim of a claim statement's `row`, sent at `started` and answered at `answered`."""
    result = Claim(
        item_id=row.item_id, kind=row.kind, run_id=row.run_id, step_key=row.step_key, attempts=row.attempts,
        token=token, worker=worker, db=db, valid_until=valid_until(started),
        # SQLite's clock is this machine's, read after the statement: exact, not a bracket.
        db_time=row.db_now, sent_at=started if backend.of(db).CLOCK_AT_SEND else answered, db_time_at=answered,
        run=row.run, cancel_requested=bool(row.run and row.run.cancel_requested),
        function=row.function or "", input=row.input, group=row.group or "",
    )
    if faults.active:
        faults.hit("after_claim_commit", result.step_key)
    return result
