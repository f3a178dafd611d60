"""A worker's hold on a work item (Claim), and a completion waiting in a batch (Ending, Batch).

What a claim gives the worker and every write under it carries: the item, its token and lease,
its run's state, and the database's clock as the claim read it. claiming.py makes them, claims.py
ends them, the backends (backend.Backend) take them.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from .. import clock
from ..journal import StepRecord
from ..models import WorkItem
from ..models.runs import claimed_values
from .rows import RunState

Status = WorkItem.Status


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
    # Whether the claim wrote its run `running` (a claim of one item does). One taken in a batch
    # leaves its run as it was: its end writes who claimed it and when (queries.claimed_by), and
    # the worker marks it `running` if it is still running after a moment (claims.mark_running).
    marked: bool = True
    lost: bool = field(default=False)
    reported: bool = False  # the loss was logged (once per claim)
    # Set before the statement that ends the item is sent: a heartbeat that finds the claim gone
    # from then on met that end (or the end will find the claim lost and say so), not a thief.
    ending: bool = False
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
    # The batch its run's completion goes into instead of a statement of its own (finish_run);
    # the worker writes the batch with finish_runs(). None: written at once.
    batch: Batch | None = field(default=None, repr=False)

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

    def unwritten(self) -> tuple[str | None, dt.datetime | None]:
        """(worker, when) of this claim, for the end of its turn to write on its run (in SQL
        queries.claimed_by), or (None, None) where the claim wrote them itself."""
        return (None, None) if self.marked else (self.worker[:200], self.db_time)

    def claimed_fields(self) -> dict:
        """The same as fields of the run's update (models.runs.claimed_values), or none."""
        worker, at = self.unwritten()
        return {} if worker is None else claimed_values(worker, at)


@dataclass
class Ending:
    """A run's completion waiting in a batch (Claim.batch): written by finish_runs()."""

    claim: Claim
    result: str | None
    records: list[StepRecord]
    committed: Callable[[], None] | None


class Batch:
    """A worker's completions not written yet (Claim.batch). The engine adds each as its run
    completes, on the worker's main thread; they are taken whole to be written, by the main thread
    between items or by the maintenance thread while an item runs long. Under one lock, so that no
    completion is both written and kept, nor lost between the two; one being written still counts
    as held (claims(): the heartbeat renews its lease until it is written)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: list[Ending] = []
        self._writing: list[Ending] = []

    def append(self, ending: Ending) -> None:
        with self._lock:
            self._waiting.append(ending)

    def take(self) -> list[Ending]:
        """Every completion waiting, in order, to be written: then written() or put_back()."""
        with self._lock:
            taken, self._waiting = self._waiting, []
            self._writing.extend(taken)
        return taken

    def written(self, taken: list[Ending]) -> None:
        with self._lock:
            self._unwriting(taken)

    def put_back(self, taken: list[Ending]) -> None:
        """Not written (the statement failed): waiting again, ahead of any added since."""
        with self._lock:
            self._unwriting(taken)
            self._waiting[:0] = taken

    def _unwriting(self, taken: list[Ending]) -> None:
        done = {id(ending) for ending in taken}
        self._writing = [ending for ending in self._writing if id(ending) not in done]

    def claims(self) -> list[Claim]:
        """The claims of the completions waiting or being written."""
        with self._lock:
            return [ending.claim for ending in (*self._writing, *self._waiting)]

    def __len__(self) -> int:
        """How many wait to be taken."""
        return len(self._waiting)
