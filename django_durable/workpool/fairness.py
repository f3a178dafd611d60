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
* each key has a row (FairTurn): the last turn it gave and how many items took it; a key that has
  fallen behind the clock (idle, or just arrived) starts again at the clock, the others go on
  after their last turn;
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
queue take turns, starts of different keys do not. On PostgreSQL a start() takes its turn in its
one statement (queries.START with FAIR_TURN), start_many() one statement per key before its insert.
"""

from __future__ import annotations

import datetime as dt

from django.db import transaction

from .. import clock, conf, queues
from ..models import FairTurn, WorkItem
from . import queries, statements

__all__ = ["TICK", "given", "turns", "weight"]

# The distance between two turns of a key.
TICK = dt.timedelta(microseconds=1)


def weight(queue: str, key: str) -> int | None:
    """The weight of `key` in `queue` (1 unless DURABLE_QUEUES gives another), None if the queue is not fair."""
    fair = queues.fair(queue)
    return None if fair is None else fair.weight(key)


def turns(db: str, queue: str, key: str, count: int = 1) -> list[dt.datetime] | None:
    """The turns of `count` new items of `key` in `queue`, in order, taken for them; None when
    `queue` is not fair. Inside the caller's transaction, if any: the key's row stays locked until
    it commits."""
    w = weight(queue, key)
    if w is None:
        return None
    if conf.is_postgres(db):  # one statement: its row lock lasts as long as the caller's transaction
        sql = queries.FAIR_TURN_ALONE.format(now=clock.now_sql("postgresql"))
        last, used = statements.execute(db, sql, [queue, key, count, w, queue])[0]
    else:
        with transaction.atomic(using=db, savepoint=False):  # a read, then a write: one transaction
            last, used = _take(db, queue, key, count, w)
    return given(last, used, count, w)


def given(last: dt.datetime, used: int, count: int, w: int) -> list[dt.datetime]:
    """The turns of the `count` items just given, from the key's row after (its last turn, and how
    many items took it): counted back from the last, w items to a turn."""
    return [last - TICK * ((count - 1 - n + w - used) // w) for n in range(count)]


def _take(db: str, queue: str, key: str, count: int, w: int) -> tuple[dt.datetime, int]:
    """queries.FAIR_TURN on SQLite, whose transaction holds the database's write lock from its start:
    the key's row after `count` more items."""
    head = WorkItem.objects.using(db).ready([queue]).values_list("available_at", flat=True).first()
    now = head if head is not None else clock.now()
    row = FairTurn.objects.using(db).filter(queue=queue, key=key).first()
    if row is None or row.turn < now:  # new, or behind the queue's clock: starts again at it
        last, used = now + TICK * ((count - 1) // w), (count - 1) % w + 1
    else:
        last, used = row.turn + TICK * ((row.used + count - 1) // w), (row.used + count - 1) % w + 1
    FairTurn.objects.using(db).update_or_create(queue=queue, key=key, defaults={"turn": last, "used": used})
    return last, used
