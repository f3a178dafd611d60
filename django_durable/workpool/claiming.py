"""Taking work: a worker's claim of one ready item or of several, and a claim given back unused.

A claim locks the next ready item (SKIP LOCKED on PostgreSQL, a compare-and-set on SQLite), gives
it a fresh token and lease, counts the delivery and marks an advanced run running, in one short
transaction; the backend (backend.of()) does it. Every write under the claim is claims.py's.
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass

from django.db import Error, transaction
from django.db.models import F

from .. import faults
from .. import queues as durable_queues
from ..ids import random_uuids
from ..models import WorkflowRun, WorkItem
from . import backend, wakeups
from .holds import Claim
from .leases import lease_seconds, valid_until
from .rows import ClaimParams, Claimed, Place

Status = WorkItem.Status

# How long a claimer may start its claims at its floor before it looks from the start of the
# claim order again (Floors).
FLOOR_SECONDS = 1.0


class Floors:
    """Where each claimer of this process stands in the claim order, so that its next claim starts
    there instead of at the start of the ready index.

    Every claim leaves an entry behind in the ready index (the item's pending version) until
    VACUUM removes it, and VACUUM may remove none while any snapshot older than it is open: a
    long report, a session idle in transaction, a replica's feedback. A claim from the start of the
    index then visits every such entry's row, and at a thousand claims a second a held snapshot
    makes each claim slower than the one before. A claim from the floor (the last item the claimer
    took: its priority, available_at and id) passes over them inside the index.

    A claim from the floor takes from two ranges of the index: the items of a higher priority, and
    those of the floor's priority at or after it. Items it does not see are those that came in
    behind it (an item whose transaction began before the floor's item was ready and committed
    after it was claimed, or one given back in its place). So a claim that finds nothing from its
    floor looks from the start at once (nothing is ready only when nothing is ready from the
    start), and a claimer looks from the start at least every FLOOR_SECONDS: such an item waits at
    most that much longer. Claims of several queues, or of queues with limits or fair shares (whose
    items may be held back, or ready again at an earlier turn), always look from the start.
    """

    def __init__(self, clock=time.monotonic) -> None:
        self._at: dict[tuple, tuple[Place, float]] = {}
        self.clock = clock

    def clear(self) -> None:
        """Forget every floor: each claimer's next claim looks from the start."""
        self._at.clear()

    @staticmethod
    def _key(db: str, queues: list[str] | None) -> tuple:
        return db, tuple(queues or ())

    def of(self, db: str, queues: list[str] | None) -> Place | None:
        """The floor a claim of `queues` starts at, or None: from the start of the claim order."""
        entry = self._at.get(self._key(db, queues))
        if entry is None or self.clock() - entry[1] >= FLOOR_SECONDS or not _first_come(queues):
            return None
        return entry[0]

    def moved(self, db: str, queues: list[str] | None, floor: Place | None, places: list[Place]) -> None:
        """After a claim from `floor` (None: from the start) that took the items at `places`: the
        floor is the last of them. A claim from the start that took nothing leaves the floor where
        it was, looked past as of now (nothing was ready before it); one from the floor that took
        nothing makes the claimer's next claim look from the start (claim() and claim_many() do at
        once; after an ending's claim, it is the worker's next)."""
        key = self._key(db, queues)
        if not _first_come(queues):
            self._at.pop(key, None)
            return
        entry = self._at.get(key)
        if places:
            last = max(places, key=lambda place: (-place.priority, place.available_at, place.id))
            self._at[key] = (last, entry[1] if floor is not None and entry is not None else self.clock())
        elif entry is not None:
            self._at[key] = (entry[0], self.clock() if floor is None else -math.inf)


floors = Floors()


def _first_come(queues: list[str] | None) -> bool:
    """Whether a claim of `queues` may start at its floor: every queue or one, none of them with a
    limit or fair shares."""
    if queues is not None and len(queues) > 1:
        return False
    return not any(queues is None or name in queues for name in durable_queues.configured())


@dataclass(frozen=True)
class ClaimRequest:
    """What a worker asks for when it claims: who it is, which queues it serves, and the items it
    just declined for lack of their code (`avoid`: the workers that have it go first)."""

    worker: str
    queues: list[str] | None
    avoid: tuple[int, ...] = ()


def claim(*, worker: str, queues: list[str] | None, db: str, avoid: tuple[int, ...] = ()) -> Claim | None:
    """Claim the next ready work item for `worker` (not one in `avoid`); return the Claim (with its run) or None."""
    request, send, floor = ClaimRequest(worker, queues, avoid), backend.of(db).claim, floors.of(db, queues)
    result = claimed(db, request, send, floor)
    if result is None and floor is not None:  # nothing from the floor: look from the start
        result = claimed(db, request, send, None)
    return result


def batches(db: str, queues: list[str] | None) -> bool:
    """Whether the worker claims and completes in batches here (claim_many(), finish_runs()):
    PostgreSQL, plain tables, a worker of every queue or of one, none of them limited."""
    return backend.of(db).batches(db, queues)


def claim_many(*, worker: str, queues: list[str] | None, db: str, k: int, from_start: bool = False) -> list[Claim]:
    """Claim up to `k` ready work items for `worker` at once (on PostgreSQL in one statement), each
    with its own token and lease, as claim() would one after the other."""
    if not from_start:
        durable_queues.refresh(db)  # (see claimed())
    tokens = random_uuids(k)
    floor = None if from_start else floors.of(db, queues)
    started = time.monotonic()
    try:
        rows = backend.of(db).claim_many(
            ClaimParams(worker[:200], queues, db, tokens[0], lease_seconds(), floor=floor), tokens)
        answered = time.monotonic()
        floors.moved(db, queues, floor, [row.place for row, _ in rows])
        if not rows and floor is not None:  # nothing from the floor: look from the start
            return claim_many(worker=worker, queues=queues, db=db, k=k, from_start=True)
        # A batch's claims leave their runs as they were (a branch never writes its run).
        return [_claim_of(row, token, worker, db, started, answered, marked=row.kind != WorkItem.Kind.ADVANCE)
                for row, token in rows]
    except Error:
        _unanswered.setdefault(db, []).extend(tokens)
        raise


def unclaim(claims: list[Claim]) -> int:
    """Give back claims taken ahead and never started (a batch's), fenced each by its token, as if
    never made (_give_back). Return how many were still held. If the statement fails, it may have
    committed all the same: the claims are given up either way, and their tokens kept to be given
    back once the database answers (hand_back_unanswered), as a claim's whose answer was lost."""
    if not claims:
        return 0
    db, tokens = claims[0].db, [claim.token for claim in claims]
    for claim in claims:
        claim.lost = True  # (it is not ours any more, whichever way: none of them starts)
    try:
        return _give_back(db, tokens)
    except Error:
        _unanswered.setdefault(db, []).extend(tokens)
        raise


def _give_back(db: str, tokens: list[uuid.UUID]) -> int:
    """Free the items still claimed with `tokens` as if never claimed: each ready again in its
    place (its available_at unchanged) and not counted as a delivery, its run pending again; idle
    workers are told. Return how many."""
    with transaction.atomic(using=db):
        items = WorkItem.objects.using(db).filter(claim_token__in=tokens, status=Status.PROCESSING)
        runs = list(items.values_list("run_id", flat=True))
        freed = items.free(Status.PENDING, attempts=F("attempts") - 1)
        if runs:
            WorkflowRun.objects.using(db).filter(pk__in=runs).back_to_pending()
            wakeups.notify(db)
    floors.clear()  # they are ready again in their places, before the floor
    return freed


# The tokens of claims whose statement failed without an answer, by database, and of claims whose
# give-back failed so (unclaim). Such a statement may have committed all the same (a primary that
# died after its commit reached the standby), or not: the items may then be claimed with those
# tokens and their worker does not know it, renews no lease of theirs, and a reaper would take
# them back as a lost worker's, a delivery counted. The worker gives them back as never made once
# the database answers (hand_back_unanswered).
_unanswered: dict[str, list[uuid.UUID]] = {}


def hand_back_unanswered(db: str) -> int:
    """Give back, as never made, the items claimed by statements of this process whose answer was
    lost, or whose give-back's answer was (their tokens kept by claimed(), claim_many() and
    unclaim()): each ready again in its place and not
    counted as a delivery, its run pending again. Return how many were claimed so."""
    kept = _unanswered.get(db)
    if not kept:
        return 0
    tokens = kept[:]
    freed = _give_back(db, tokens)
    del kept[:len(tokens)]
    return freed


_OWN_FLOOR = Place(0, "", 0)  # claimed()'s default: the claimer's floor, looked up


def claimed(db: str, request: ClaimRequest | None, send, floor: Place | None = _OWN_FLOOR) -> Claim | None:
    """Call `send` with the ClaimParams of a claim for `request` (None: no claim asked for), from
    `floor` (None: from the start; by default the claimer's own); turn the Claimed it answers into
    a Claim."""
    if request is None:
        send(None)
        return None
    durable_queues.refresh(db)  # limits set at runtime (at most once a second)
    token = random_uuids(1)[0]
    if floor is _OWN_FLOOR:
        floor = floors.of(db, request.queues)
    started = time.monotonic()
    try:
        row = send(ClaimParams(request.worker[:200], request.queues, db, token, lease_seconds(), request.avoid,
                               floor))
        floors.moved(db, request.queues, floor, [row.place] if row is not None else [])
        if row is None:
            return None
        return _claim_of(row, token, request.worker, db, started, time.monotonic())
    except Error:
        _unanswered.setdefault(db, []).append(token)
        raise


def _claim_of(row: Claimed, token, worker: str, db: str, started: float, answered: float,
              marked: bool = True) -> Claim:
    """The Claim of a claim statement's `row`, sent at `started` and answered at `answered`
    (`marked`: whether the statement wrote the run `running`, as a claim of one item does)."""
    result = Claim(marked=marked,
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
