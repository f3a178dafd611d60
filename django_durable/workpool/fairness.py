"""Fair shares within a queue: its concurrency keys take turns (DURABLE_QUEUES[...]["fairness"]).

    DURABLE_QUEUES = {"reports": {"fairness": True}}                          # equal shares
    DURABLE_QUEUES = {"reports": {"fairness": {"weights": {"acme": 3}}}}      # acme takes 3 turns

Without fairness a queue is first come, first served: a tenant that queues 10,000 reports makes the
next tenant's 10 wait behind all of them. In a fair queue each item is given its *turn* when it is
queued, and its `available_at` is set to it, so every claim (one at a time or in batches, by a
worker of that queue or of all of them, on PostgreSQL or SQLite) takes items in turn order through
the ready index it already walks: the claim is not changed and costs nothing more.

The turns are start-time fair queueing, with the queue's head as its clock:

* the queue's clock is the `available_at` of its first ready item (now, when none is ready);
* each key has a row (FairTurn) with the turn its next item takes; a key that has fallen behind the
  clock (idle, or just arrived) starts again at the clock;
* a key's turns are one microsecond apart, and a key of weight w gives each turn to w items.

So a key with a backlog has turns running ahead of the clock, one a microsecond, and a key that
arrives later starts at the clock: its items come between the backlog's next ones, one each, and
the claims alternate between the keys that have items ready (w of a weighted key to one of each
other). Turns are stamped one microsecond apart, so a backlog stamped ahead of the wall clock (more
than a million items a second of one key) becomes ready no faster than a million a second.

A run keeps its turn: when it is woken (a step done, a signal, a timer) its item is ready again at
its turn, not at the back of the queue (WorkItemQuerySet.wake, queries.WAKE), and its branches are
queued at its turn too. So in a fair queue runs that have started go before runs that have not,
and a key's backlog of new runs never delays another key's runs between their steps.

Giving a turn takes the key's row lock until the start commits: starts of one key in one fair
queue take turns, starts of different keys do not.
"""

from __future__ import annotations

import datetime as dt

from django.db import IntegrityError, transaction

from .. import clock, queues
from ..models import FairTurn, WorkItem

__all__ = ["TICK", "turns"]

# The distance between two turns of a key.
TICK = dt.timedelta(microseconds=1)

# A new key's turn, before the queue's clock sets it.
_NEVER = dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc)


def turns(db: str, queue: str, key: str, count: int = 1) -> list[dt.datetime] | None:
    """The turns of `count` new items of `key` in `queue`, in order, taken for them; None when
    `queue` is not fair. Runs inside the caller's transaction (it opens one if there is none):
    the key's row stays locked until it commits."""
    fair = queues.fair(queue)
    if fair is None:
        return None
    weight = fair.weight(key)
    with transaction.atomic(using=db):
        row = _locked_row(db, queue, key)
        head = WorkItem.objects.using(db).ready([queue]).values_list("available_at", flat=True).first()
        now = head if head is not None else clock.database_now(db)
        if row.turn < now:  # idle, or new: the key starts again at the queue's clock
            row.turn, row.used = now, 0
        given = [row.turn + TICK * ((row.used + n) // weight) for n in range(count)]
        row.turn, row.used = row.turn + TICK * ((row.used + count) // weight), (row.used + count) % weight
        row.save(using=db, update_fields=["turn", "used"])
    return given


def _locked_row(db: str, queue: str, key: str) -> FairTurn:
    """The key's FairTurn row, locked (made if it is new: of two first starts, one makes it)."""
    rows = FairTurn.objects.using(db).select_for_update()
    row = rows.filter(queue=queue, key=key).first()
    if row is None:
        try:
            with transaction.atomic(using=db):
                FairTurn.objects.using(db).create(queue=queue, key=key, turn=_NEVER)
        except IntegrityError:
            pass  # another start made it first
        row = rows.get(queue=queue, key=key)
    return row
