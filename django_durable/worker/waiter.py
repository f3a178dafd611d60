"""An idle worker's wait for work: a NOTIFY on PostgreSQL, a stop request, or the poll interval."""

from __future__ import annotations

import logging
import os
import select
import time


from .. import conf, workpool
from ..humanize import one_line
from ..workpool import listening
from .connection import Backoff

logger = logging.getLogger("django_durable.worker")


# The longest wait between two tries to listen again (while failing, the worker polls).
LISTEN_RETRY_CAP = 10.0


class Waiter:
    """Sleeps until work may be ready: a NOTIFY on PostgreSQL, a stop request, or the poll interval.

    LISTEN needs a dedicated session; behind a transaction-mode pooler it silently hears
    nothing, which only makes us slower: the poll interval keeps everything correct.
    """

    def __init__(self, db: str, wake_fd: int):
        self.db = db
        self.wake_fd = wake_fd
        self.listener = None
        self._lost = False  # the listening session failed: say so when it is back
        self._listen_at = 0.0  # no LISTEN before this (time.monotonic())
        self._backoff = Backoff(first=0.5, cap=LISTEN_RETRY_CAP)

    def listen(self):
        if self.listener is not None or time.monotonic() < self._listen_at or not conf.listens(self.db):
            return self.listener
        try:
            self.listener = listening.session(self.db, [workpool.NOTIFY_CHANNEL])
        except Exception as exc:  # noqa: BLE001 - polling still works without notifications
            if not self._lost:
                logger.warning("LISTEN failed (%s); polling until it succeeds.", one_line(exc))
            self._failed()
            return None
        if self._lost:
            logger.info("Listening for notifications again.")
            self._lost = False
        self._backoff.reset()
        return self.listener

    def begins_listening(self) -> bool:
        """Listen if not listening (and allowed to try again); return True if listening began
        now. A notification sent before then was not heard: look for work once more before a wait.
        """
        return self.listener is None and self.listen() is not None

    def _failed(self) -> None:
        """The listening session failed: poll, and try again after a growing back-off."""
        self._lost = True
        self._listen_at = time.monotonic() + self._backoff.next()
        self.close()

    def reset(self) -> None:
        """The database failed the worker's own session: the listening one is likely dead too
        (a restart, a failover). Drop it and listen again at the next wait, after the back-off."""
        if self.listener is not None:
            self._lost = True
            self.close()

    def wait(self, timeout: float) -> None:
        listener = self.listen()
        fds = [self.wake_fd] + ([listener.fileno()] if listener is not None else [])
        try:
            select.select(fds, [], [], timeout)
            if listener is not None and sum(1 for _ in listener.notifies(timeout=0)):
                logger.debug("Woken by a notification.")
        except Exception as exc:  # noqa: BLE001 - a dead listener is replaced on the next wait
            logger.warning("Lost the LISTEN connection (%s); polling every %gs until listening again.",
                           one_line(exc), timeout)
            self._failed()
        self._drain()

    def sleep(self, seconds: float) -> None:
        select.select([self.wake_fd], [], [], seconds)
        self._drain()

    def _drain(self) -> None:
        try:
            while os.read(self.wake_fd, 64):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        if self.listener is not None:
            try:
                self.listener.close()
            except Exception:  # noqa: BLE001
                pass
            self.listener = None
