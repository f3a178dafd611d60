"""Helpers for testing workflows: run queued work in-process, and a clock tests can move."""

from __future__ import annotations

import datetime as dt
from contextlib import contextmanager

from django.utils import timezone

from . import clock as _clock
from . import conf, schedules, workpool
from .engine.branches import run_branch
from .engine.replay import advance
from .models import WorkItem


def drain(*, queues: list[str] | None = None, max_items: int = 10_000, worker: str = "testing") -> int:
    """Advance every ready run in this process until no work is ready; return how many items ran.

    Timers and schedules that are due (by the database's clock, or the frozen test clock) fire
    first. Works
    inside a test's transaction, so plain ``django_db`` tests can start a run and drain it.
    """
    db = conf.get("DATABASE")
    request = workpool.ClaimRequest(worker, queues)
    done, claim = 0, None
    while done < max_items:
        if claim is None:
            workpool.fire_timers(db=db)
            schedules.tick(db=db)
            claim = workpool.claim(worker=worker, queues=queues, db=db)
        if claim is None:
            break
        # Like a worker: the statement that ends one item claims the next.
        chain = lambda: request if done + 1 < max_items else None  # noqa: E731
        if claim.kind == WorkItem.Kind.ADVANCE:
            advance(claim, chain=chain)
        elif claim.kind == WorkItem.Kind.STEP:
            run_branch(claim, chain=chain)
        done += 1
        claim = claim.next_claim
    return done


class TestClock:
    """The frozen clock of a test: `advance()` moves it, `now` reads it."""

    def __init__(self, start: dt.datetime):
        self.now = start
        _clock.freeze(start)

    def advance(self, delta: dt.timedelta | None = None, **kwargs) -> dt.datetime:
        """Move the clock forward by `delta` or by timedelta(**kwargs); return the new time."""
        delta = delta if delta is not None else dt.timedelta(**kwargs)
        if delta < dt.timedelta(0):
            raise ValueError(f"The test clock only moves forward, not by {delta}.")
        return self.set(self.now + delta)

    def set(self, when: dt.datetime) -> dt.datetime:
        self.now = when
        _clock.freeze(when)
        return when


@contextmanager
def clock(start: dt.datetime | None = None):
    """Freeze the engine's clock (leases, timers, deadlines, recorded times) for a test.

    It starts at `start` or now; rows the database stamps itself (created_at) keep real time,
    so start no earlier than now.
    """
    try:
        yield TestClock(start or timezone.now())
    finally:
        _clock.freeze(None)


def load_run(data, *, run_id=None):
    """Store a run exported with ``manage.py durable export RUN_ID`` (its file's path, or its
    data) in the test database and return it: ``drain()`` then replays its journal against the
    code under test and carries it on. See django_durable.export."""
    from .export import load_run as load

    return load(data, run_id=run_id)
