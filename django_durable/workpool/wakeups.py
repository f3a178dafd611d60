"""Waking runs: their advance made ready, due timers fired, idle workers and waiting callers told.

NOTIFY is a hint only (a worker behind a transaction-mode pooler never hears it): polling keeps
everything correct, notifications only make it prompt.
"""

from __future__ import annotations

from django.db import connections, transaction
from django.db.models import OuterRef, Q, Subquery

from .. import clock, conf
from .. import queues as durable_queues
from ..models import Timer, WorkItem
from ..models.pool import paused_queues
from . import queries

NOTIFY_CHANNEL = "durable_work"

TIMER_BATCH = 1000


def wake(run_ids, *, db: str) -> int:
    """Make these runs' advance items ready; one being processed is flagged to run again.

    Return how many items there were (a run without one has nothing that could advance it).
    """
    if not isinstance(run_ids, (list, tuple, set)):
        run_ids = [run_ids]
    woken = WorkItem.objects.using(db).filter(run_id__in=run_ids, kind=WorkItem.Kind.ADVANCE).wake()
    notify(db)
    return woken


def notify(db: str) -> None:
    """On PostgreSQL, wake idle workers when the current transaction commits (a hint only)."""
    if conf.listens(db):
        with connections[db].cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, '')", [NOTIFY_CHANNEL])


def announce_end(run_ids, *, db: str) -> None:
    """On PostgreSQL, tell the durable.wait() calls of these runs, if any, that they ended (at commit)."""
    if conf.listens(db):
        with connections[db].cursor() as cursor:
            cursor.execute(queries.ANNOUNCE, [list(run_ids)])


def listen_params(db: str) -> dict:
    """The connection parameters of a session of its own to LISTEN on, for the database `db`
    (DURABLE_LISTEN_DATABASE when the durable tables are behind a transaction pooler)."""
    params = connections[conf.get("LISTEN_DATABASE") or db].get_connection_params()
    params.pop("cursor_factory", None)
    return params


def announce_stream(run_id, *, db: str) -> None:
    """On PostgreSQL, wake the readers of the run's streams (GET .../stream/): a hint only."""
    if conf.listens(db):
        with connections[db].cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [queries.STREAM_CHANNEL, str(run_id)])


def fire_timers(*, db: str, batch: int = TIMER_BATCH) -> int:
    """Fire the timers that are due (by the database's clock) and wake their runs; return how many.

    Several workers may do this at once: on PostgreSQL each takes different timers (SKIP
    LOCKED), on SQLite the transaction serializes them; each timer fires once.
    """
    with transaction.atomic(using=db):
        due = Timer.objects.using(db).filter(status=Timer.Status.PENDING, fire_at__lte=clock.db_now())
        if conf.is_postgres(db):
            due = due.select_for_update(skip_locked=True, no_key=True)
        timers = list(due.order_by("fire_at").values("id", "run_id", "kind")[:batch])
        if not timers:
            return 0
        ids = [t["id"] for t in timers]
        Timer.objects.using(db).filter(id__in=ids, status=Timer.Status.PENDING).update(
            status=Timer.Status.FIRED, fired_at=clock.db_now()
        )
        if starts := [t["run_id"] for t in timers if t["kind"] == Timer.Kind.DELAYED_START]:
            # A delayed start takes its place among the ready runs as of its run_at, not of now.
            WorkItem.objects.using(db).filter(run_id__in=starts, kind=WorkItem.Kind.ADVANCE,
                                              status=WorkItem.Status.COMPLETED).update(
                status=WorkItem.Status.PENDING,
                available_at=Subquery(Timer.objects.using(db).filter(
                                          id__in=ids, run_id=OuterRef("run_id"), kind=Timer.Kind.DELAYED_START)
                                      .values("fire_at")[:1]),
            )
        wake([t["run_id"] for t in timers if t["run_id"] is not None], db=db)
    return len(timers)


def next_timer_in(*, db: str) -> float | None:
    """Seconds until the earliest pending timer is due (by the database's clock), or None."""
    from django.db.models import Min

    earliest = Timer.objects.using(db).filter(status=Timer.Status.PENDING).aggregate(at=Min("fire_at"))["at"]
    if earliest is None:
        return None
    if conf.is_postgres(db) and not clock.is_frozen():
        with connections[db].cursor() as cursor:
            cursor.execute("SELECT EXTRACT(EPOCH FROM %s - statement_timestamp())", [earliest])
            return float(cursor.fetchone()[0])
    return (earliest - clock.now()).total_seconds()


def held_back(*, queues: list[str] | None, db: str) -> bool:
    """Return True if ready items of limited queues among `queues` (DURABLE_QUEUES) wait for a slot
    or for their rate; False at once when none of them is limited."""
    limits = durable_queues.served(queues)
    if not limits:
        return False
    return WorkItem.objects.using(db).ready([limit.name for limit in limits]).exists()


def pending_work(*, queues: list[str] | None, db: str) -> bool:
    """Return True while work is ready now, claimed by some worker, or due from a timer.

    A burst worker keeps going while this holds. A queue paused at runtime has no work for it.
    """
    items = WorkItem.objects.using(db).filter(
        Q(status=WorkItem.Status.PENDING, available_at__lte=clock.db_now()) | Q(status=WorkItem.Status.PROCESSING)
    )
    if queues:
        items = items.filter(queue__in=queues)
    items = items.exclude(queue__in=paused_queues())
    due = Timer.objects.using(db).filter(status=Timer.Status.PENDING, fire_at__lte=clock.db_now())
    # One statement, so one snapshot: asked one after the other, a claim that expires (processing
    # to pending) or a timer that fires (timer fired, item pending) between two questions would
    # be seen by neither, and a burst worker would leave that work behind.
    (items_sql, items_params), (due_sql, due_params) = (
        qs.values("id")[:1].query.get_compiler(using=db).as_sql() for qs in (items, due)
    )
    with connections[db].cursor() as cursor:
        cursor.execute(f"SELECT EXISTS({items_sql}) OR EXISTS({due_sql})", [*items_params, *due_params])
        return bool(cursor.fetchone()[0])
