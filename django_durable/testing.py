"""Helpers for testing workflows: run queued work in-process, without worker processes."""

from __future__ import annotations

from . import conf, workpool
from .engine.replay import advance
from .models import WorkItem


def drain(*, queues: list[str] | None = None, max_items: int = 10_000, worker: str = "testing") -> int:
    """Advance every ready run in this process until no work is ready; return how many items ran.

    Timers that are due (by the database's clock, or the frozen test clock) fire first. Works
    inside a test's transaction, so plain ``django_db`` tests can start a run and drain it.
    """
    db = conf.get("DATABASE")
    done = 0
    while done < max_items:
        workpool.fire_timers(db=db)
        claim = workpool.claim(worker=worker, queues=queues, db=db)
        if claim is None:
            break
        if claim.kind == WorkItem.Kind.ADVANCE:
            advance(claim)
        done += 1
    return done
