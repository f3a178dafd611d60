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

# libpq's settings for a session that must notice a database gone silent: a host cut off from it,
# a server that vanished without closing its sockets. Without them the kernel retransmits for about
# 15 minutes while the session waits in a statement (or forever, for one that only listens and
# sends nothing). With them an idle session probes after 5 s, anything unanswered for 15 s
# (tcp_user_timeout) ends the connection, and a connect gives up after 5 s. Every listening
# session gets them; so does every PostgreSQL connection of a worker process
# (worker.connection.find_dead_peers). A name in the database's OPTIONS wins.
TCP_SETTINGS = {"keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2, "keepalives_count": 3,
                "tcp_user_timeout": 15_000, "connect_timeout": 5}
# The seconds within which a worker's call to a silent database fails: 15 unanswered (the
# statement), then up to 5 more when the statement was in a transaction, whose end Django meets
# by connecting again to reset the session (connect_timeout).
DEAD_PEER_SECONDS = 20.0


def _params(db: str) -> dict:
    return {**TCP_SETTINGS, **listen_params(db)}


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
