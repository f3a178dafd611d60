"""The rows the hot path reads, by name.

Each class is the one definition of a row's columns and their order: the PostgreSQL statements
build their JSON arrays from these fields and the SQLite queries select them in the same order,
so the engine reads `entry.status`, never `entry[4]`.
"""

from __future__ import annotations

import datetime as dt
import uuid
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


class Claimed(NamedTuple):
    """What a claim statement answers: the item, the database's clock, and its run's state
    (None when the run finished or vanished before the claim)."""

    item_id: int
    kind: str
    run_id: uuid.UUID | None
    step_key: str
    attempts: int
    db_now: dt.datetime
    run: object  # workpool.RunState | None
    function: str | None
    input: str | None
    group: str | None
