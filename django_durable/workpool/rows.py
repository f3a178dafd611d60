"""The rows the hot path reads and the parameters it sends, by name.

Each class is the one definition of a row's columns and their order: the PostgreSQL statements
build their JSON arrays from these fields and select their columns in this order, and the SQLite
queries select them in the same order, so the engine reads `entry.status`, never `entry[4]`.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass, field
from typing import NamedTuple


class Entry(NamedTuple):
    """A journal entry, as replay and a branch read it (the times as text on PostgreSQL)."""

    key: str
    seq: int
    kind: str
    name: str
    status: str
    result: str | None
    error: str | None
    attempts: int
    deadline_at: dt.datetime | str | None
    retry_at: dt.datetime | str | None
    match: str | None
    fingerprint: str | None


class Message(NamedTuple):
    """A signal or event not consumed yet, oldest first."""

    id: int
    kind: str
    name: str
    target_key: str
    payload: str
    created_at: dt.datetime | str


class Child(NamedTuple):
    """A child run that has finished."""

    id: uuid.UUID | str
    status: str
    result: str | None
    error: str | None


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


class Place(NamedTuple):
    """Where an item stands in the claim order (highest priority first, then the earliest
    available_at, then the lowest id): a claimer's floor (ClaimParams.floor). On SQLite the time is
    the text it stores, which is what its claims sort by."""

    priority: int
    available_at: dt.datetime | str
    id: int


class Claimed(NamedTuple):
    """What a claim answers, on either database: the item, the database's clock, and its run's
    state (None when the run finished or vanished before the claim), and the item's place in
    the claim order."""

    item_id: int
    kind: str
    run_id: uuid.UUID | None
    step_key: str
    attempts: int
    db_now: dt.datetime
    run: RunState | None
    function: str | None
    input: str | None
    group: str | None
    place: Place


class RunColumns(NamedTuple):
    """The run's columns of a claim statement's row (queries.CLAIM_SELECT), or of RUN_STATE's row
    where runs are partitioned: JSON arrays for the journal, the messages and the children. The
    workflow is NULL when the run has ended."""

    workflow: str | None
    input: str | None
    attempt: int | None
    max_attempts: int | None
    deadline_at: dt.datetime | None
    cancel_requested: bool | None
    journal: list | None
    messages: list | None
    children: list | None


class ClaimRow(NamedTuple):
    """A claim statement's row on PostgreSQL, column by column (queries.CLAIM_SELECT and
    CLAIM_ITEM_SELECT); all NULL when nothing was ready."""

    item_id: int | None
    kind: str
    run_id: uuid.UUID | None
    step_key: str
    attempts: int
    db_now: dt.datetime
    workflow: str | None
    input: str | None
    attempt: int | None
    max_attempts: int | None
    deadline_at: dt.datetime | None
    cancel_requested: bool | None
    journal: list | None
    messages: list | None
    children: list | None
    function: str | None
    item_input: str | None
    group: str | None
    priority: int
    available_at: dt.datetime

    def with_run(self, run: RunColumns) -> ClaimRow:
        """This row with its run's columns read apart (RUN_STATE, where runs are partitioned)."""
        return self._replace(**run._asdict())

    def claimed(self) -> Claimed | None:
        """The claim, named and its JSON decoded; None when nothing was ready."""
        if self.item_id is None:
            return None
        run = None
        if self.workflow is not None:
            run = RunState(self.workflow, self.input, self.attempt, self.max_attempts, self.deadline_at,
                           bool(self.cancel_requested),
                           [Entry._make(entry) for entry in self.journal] if self.journal else [],
                           [Message._make(message) for message in self.messages] if self.messages else [],
                           [Child._make(child) for child in self.children] if self.children else [])
        return Claimed(self.item_id, self.kind, self.run_id, self.step_key, self.attempts, self.db_now, run,
                       self.function, self.item_input, self.group, Place(self.priority, self.available_at, self.item_id))


class ClaimParams(NamedTuple):
    """What a backend's claim statement is given: the claimer, the queues it serves, the
    database, the new claim's token and lease, the items it must not take (`avoid`), and its
    `floor`: when given, only items of the floor's priority at or after it in the claim order
    (claiming.Floors says why and when)."""

    worker: str
    queues: list[str] | None
    db: str
    token: uuid.UUID
    lease: float
    avoid: tuple[int, ...] = ()
    floor: Place | None = None
