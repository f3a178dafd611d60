"""The contract of a database's hot path: every verb the workpool's face calls on it.

Two modules implement it, each whole: ``postgres`` (one statement a verb, the batch verbs one
statement for many claims) and ``sqlite`` (compare-and-set updates in an IMMEDIATE transaction;
its batch verbs are its single verbs in a loop inside one transaction). The face (claiming.py,
claims.py) reaches them only through of() below, so a verb added here is a verb every database
has: the type checker (``make test`` runs mypy on this module) holds both modules to this
Protocol, and tests/test_contract.py runs every verb through every implementation and compares
the rows.

The verbs that end a claim answer (whether the fence held, or how the run ended; the worker's
next claim when `next_claim` asked for one in the same statement, or None where a database
claims next with a statement of its own).
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import TYPE_CHECKING, Protocol

from .. import conf
from . import postgres, sqlite

if TYPE_CHECKING:
    from ..journal import StepRecord
    from .holds import Claim, Ending
    from .rows import ClaimParams, Claimed


class Backend(Protocol):
    """A database's hot path: the claim, and every fenced write under a claim."""

    # Whether the claim's `db_now` is the database's clock when the statement began (PostgreSQL:
    # the lease counts from when it was sent) or a reading after it answered (SQLite, this
    # machine's clock: exact).
    CLOCK_AT_SEND: bool

    def claim(self, params: ClaimParams) -> Claimed | None:
        """Take the next ready item (not one of `params.avoid`) with `params.token`; None if none is ready."""
        ...

    def batches(self, db: str, queues: list[str] | None) -> bool:
        """Whether the worker should claim and complete in batches here (a choice of speed: the
        batch verbs work everywhere)."""
        ...

    def claim_many(self, params: ClaimParams, tokens: list[uuid.UUID]) -> list[tuple[Claimed, uuid.UUID]]:
        """Take up to len(tokens) ready items, each with its own token; (the claim, its token) each,
        in the order a claim at a time would have taken them (priority first, then when ready)."""
        ...

    def record_steps(self, claim: Claim, records: list[StepRecord]) -> tuple[int, bool]:
        """Write journal entries, fenced; how many were written, and whether a cancel was requested."""
        ...

    def finish_run(self, claim: Claim, *, status: str, result: str | None, error: str | None,
                   records: list[StepRecord], next_claim: ClaimParams | None = None,
                   ) -> tuple[str | None, Claimed | None]:
        """End the claim's run (endings.record_end's changes), fenced: the status it ended with,
        endings.UNCHANGED if it had ended before, or None if the claim is lost."""
        ...

    def finish_runs(self, endings: list[Ending]) -> dict[int, str]:
        """Complete the runs of several claims, each fenced by its own token, as finish_run() one:
        {item id: the status its run ended with, or UNCHANGED}; an item missing lost its claim."""
        ...

    def release(self, claim: Claim, *, run_status: str, waiting_on: str, requeue: bool,
                records: list[StepRecord], timers: list[tuple[str, str, dt.datetime]],
                items: list[tuple[str, str, str, str]], notify: bool,
                next_claim: ClaimParams | None = None) -> tuple[bool, Claimed | None]:
        """Hand the claim's run back (it waits, or goes back to the queue), fenced."""
        ...

    def finish_branch(self, claim: Claim, record: StepRecord, *, group: str, failed: bool, fail_fast: bool,
                      next_claim: ClaimParams | None = None) -> tuple[bool, Claimed | None]:
        """Record a branch's outcome and count it off its group (waking the run when done), fenced."""
        ...

    def retry_branch(self, claim: Claim, record: StepRecord, *, retry_at: dt.datetime,
                     next_claim: ClaimParams | None = None) -> tuple[bool, Claimed | None]:
        """Record a branch's failed attempt and queue it again for `retry_at`, fenced."""
        ...


def of(db: str) -> Backend:
    """The hot path of database alias `db`."""
    return postgres if conf.is_postgres(db) else sqlite


if TYPE_CHECKING:  # what the type checker holds to the contract
    _POSTGRES: Backend = postgres
    _SQLITE: Backend = sqlite
