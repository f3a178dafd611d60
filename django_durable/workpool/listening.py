"""Sessions of their own that LISTEN, and the wait for a notification: how the worker's waiter and
the stream readers (sync and async) are woken by NOTIFY (durable.wait() listens on its own Django
connection, and waits with heard() too).

A notification is a hint only: every listener also looks again after a pause, so one lost (a
pooler, a dropped session) costs time, never correctness. Where NOTIFY wakes nobody (SQLite, or
DURABLE_LISTEN_NOTIFY off: conf.listens) there is no session and the callers poll.
"""

from __future__ import annotations

import time

from .. import conf
from .wakeups import listen_params

# A session that only listens sends nothing: without TCP keepalives a host cut off from the
# database (or a server restarted meanwhile) would leave it waiting on a dead socket.
KEEPALIVES = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3}


def _params(db: str) -> dict:
    params = listen_params(db)
    for name, value in KEEPALIVES.items():
        params.setdefault(name, value)
    return params


def session(db: str, channels: list[str]):
    """A new session of its own (autocommit) LISTENing on `channels` of database `db`, or None
    where NOTIFY wakes nobody; raises what connecting raises (the caller polls meanwhile)."""
    if not conf.listens(db):
        return None
    import psycopg

    connection = psycopg.connect(**_params(db), autocommit=True)
    try:
        for channel in channels:
            connection.execute(f"LISTEN {channel}")
    except BaseException:
        connection.close()
        raise
    return connection


async def asession(db: str, channels: list[str]):
    """session() for the event loop: psycopg's AsyncConnection (its parameters read in a thread)."""
    from asgiref.sync import sync_to_async

    if not await sync_to_async(conf.listens)(db):
        return None
    import psycopg

    connection = await psycopg.AsyncConnection.connect(**await sync_to_async(_params)(db), autocommit=True)
    try:
        for channel in channels:
            await connection.execute(f"LISTEN {channel}")
    except BaseException:
        await connection.close()
        raise
    return connection


def heard(connection, payload: str | None, seconds: float) -> bool:
    """Wait up to `seconds` for a notification on `connection` whose payload is `payload` (any,
    with None); return whether one came. Others go by; psycopg keeps those that came during a
    statement for this."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        for notice in connection.notifies(timeout=left, stop_after=1):
            if payload is None or notice.payload == payload:
                return True
    return False


async def aheard(connection, payload: str | None, seconds: float) -> bool:
    """heard() on an AsyncConnection."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        async for notice in connection.notifies(timeout=left, stop_after=1):
            if payload is None or notice.payload == payload:
                return True
    return False
