"""What a worker's two threads share about the database: the errors that mean it is away for now,
closing a broken connection, backing off before the next try, and saying that a claim was lost."""

from __future__ import annotations

import logging
import random

from django.db import DatabaseError, InterfaceError, connections

from .. import workpool
from ..interrupts import DatabaseUnavailable
from ..models import WorkItem

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
