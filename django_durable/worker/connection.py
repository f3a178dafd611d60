"""What a worker's two threads share about the database: the errors that mean it is away for now,
closing a broken connection, backing off before the next try, and saying that a claim was lost."""

from __future__ import annotations

import logging
import random
import time

from django.db import DatabaseError, InterfaceError, connections

from .. import workpool
from ..humanize import one_line
from ..interrupts import DatabaseUnavailable
from ..models import WorkItem
from ..workpool.listening import TCP_SETTINGS

logger = logging.getLogger("django_durable.worker")

DB_ERRORS = (DatabaseError, InterfaceError, DatabaseUnavailable)


def report_lost(claim: workpool.Claim, worker: str, what: str) -> None:
    """Log, once per claim, that `worker` lost `claim` (to a lapsed lease or an operator)."""
    if claim.reported:
        return
    claim.reported = True
    kind = "run" if claim.kind == WorkItem.Kind.ADVANCE else f"branch {claim.step_key!r} of run"
    logger.warning("Worker %s lost its claim on %s %s and %s; another worker goes on with it.",
                   worker, kind, claim.run_id, what)


def find_dead_peers() -> list[str]:
    """Give every PostgreSQL database of this process the TCP settings that notice a silent
    database (workpool.listening.TCP_SETTINGS), where its OPTIONS do not set them; return the
    aliases changed. Called by `manage.py durable_worker` as it starts, before any connection
    of its worker processes: their step code's queries get them too, so that a cut network ends a
    statement within DEAD_PEER_SECONDS instead of leaving it waiting."""
    changed = []
    for alias in connections:
        if connections[alias].vendor != "postgresql":
            continue
        options = connections.settings[alias].setdefault("OPTIONS", {})
        missing = {name: value for name, value in TCP_SETTINGS.items() if name not in options}
        if missing:
            options.update(missing)  # (in place: every connection of this alias reads this dict)
            close_connection(alias)  # one opened before (the system checks) reconnects with them
            changed.append(alias)
    return changed


def close_connection(db: str) -> None:
    try:
        connections[db].close()
    except Exception:  # noqa: BLE001 - a broken connection may fail to close; it is gone anyway
        pass


class Backoff:
    """Jittered exponential back-off for retrying the database."""

    def __init__(self, first: float = 0.1, cap: float = 5.0):
        self.first, self.cap, self.current = first, cap, first

    def next(self) -> float:
        delay = random.uniform(self.current / 2, self.current)
        self.current = min(self.current * 2, self.cap)
        return delay

    def reset(self) -> None:
        self.current = self.first


class Outage:
    """The database away, as one thread of a worker meets it: the first error of an outage, and
    the first of each new kind (refused, read-only), is a warning; the tries after it wait a
    growing, jittered back-off (up to `cap` seconds, so that workers reconnecting do not storm a
    server that is starting or a standby being promoted); the end is said once, with its length."""

    def __init__(self, first: float = 0.2, cap: float = 5.0):
        self.backoff = Backoff(first, cap)
        self.since: float | None = None  # time.monotonic() of the outage's first error
        self.retry_at = 0.0  # no try before this (time.monotonic())
        self.errors = 0
        self.kind = ""  # the last error's type: a new kind of error is a warning again

    def failed(self, exc: BaseException, who: str) -> float:
        """Note a database error of `who`; return how long to wait before the next try."""
        now = time.monotonic()
        self.errors += 1
        kind = type(exc.__cause__ or exc).__name__  # refused, read-only, shutting down...: each is said
        if self.since is None or kind != self.kind:
            self.since = self.since or now
            logger.warning("Database error in %s: %s; trying again with back-off.", who, one_line(exc))
        else:
            logger.debug("Database error in %s (%d in %.1f s): %s", who, self.errors, now - self.since,
                         one_line(exc))
        self.kind = kind
        delay = self.backoff.next()
        self.retry_at = now + delay
        return delay

    def ended(self, who: str) -> bool:
        """Note a success of `who`; return True if it ended an outage."""
        if self.since is None:
            return False
        logger.info("The database answers %s again after %.1f s (%d failed tries).", who,
                    time.monotonic() - self.since, self.errors)
        self.since, self.errors, self.retry_at, self.kind = None, 0, 0.0, ""
        self.backoff.reset()
        return True
