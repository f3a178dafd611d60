"""Running several worker processes: fork them, replace the ones that die, pass on signals."""

from __future__ import annotations

import ctypes
import logging
import math
import os
import signal
import time

from django.db import DatabaseError, connections

from .. import conf, workpool
from ..humanize import one_line
from ..workpool.listening import DEAD_PEER_SECONDS
from .process import ABANDON_SECONDS, EXIT_REPLACE, STOP_SIGNALS, Worker, process_name, shutdown_grace

logger = logging.getLogger("django_durable.worker")

PR_SET_PDEATHSIG = 1


class Supervisor:
    """Forks `concurrency` workers and keeps that many running until told to stop."""

    def __init__(self, concurrency: int, **worker_options):
        self.concurrency = concurrency
        self.worker_options = worker_options
        self.children: dict[int, int] = {}  # pid -> slot
        self.signals_received = 0
        self.killed: set[int] = set()  # children SIGKILLed for not stopping in time

    def run(self) -> int:
        # Children must open their own connections: a socket shared across fork is corrupted
        # by whichever process speaks first.
        connections.close_all()
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._on_signal)
        signal.signal(signal.SIGALRM, self._on_deadline)
        for slot in range(self.concurrency):
            self._spawn(slot)
        restarts: list[float] = []
        while self.children:
            try:
                pid, status = os.wait()
            except ChildProcessError:
                break
            slot = self.children.pop(pid, None)
            if slot is None:
                continue
            code = os.waitstatus_to_exitcode(status)
            stopping = self.signals_received or (self.worker_options.get("burst") and code == 0)
            # The death is logged first, so the line is there however long taking its claims back takes.
            if code == EXIT_REPLACE and not stopping:
                logger.warning("Worker process %d asked to be replaced; starting a new one.", pid)
            elif code != 0 and not stopping:
                logger.error("Worker process %d %s; starting a replacement.", pid, _ended(code))
            if pid in self.killed:
                # It did not stop, most likely waiting on a database that does not answer: the
                # claims it held return when their leases run out.
                logger.error("Worker process %d did not stop within %g s of the stop request; killed it.",
                             pid, self.stop_within())
            elif code not in (0, EXIT_REPLACE):
                self._bury(pid, code)
            if stopping:
                continue
            now = time.monotonic()
            restarts = [t for t in restarts if now - t < 10] + [now]
            if len(restarts) > 5 * self.concurrency:
                time.sleep(1.0)  # a crash loop must not spin the machine
            if not self.signals_received:
                self._spawn(slot)
        return 0

    def _bury(self, pid: int, code: int) -> None:
        """A child died without handing its work back: take its claims back now, not when their
        leases run out, and show it stopped."""
        name = process_name(self.worker_options.get("name"), pid)
        try:
            claims = workpool.release_worker(name, why=f"died: {_ended(code)}", witnessed=True,
                                             db=self.worker_options.get("db") or conf.get("DATABASE"))
        except DatabaseError as exc:
            logger.warning("Could not take back the claims of dead worker %s (%s); they return when their "
                           "leases run out.", name, one_line(exc))
        else:
            if claims:
                logger.warning("Took back %d claim(s) of dead worker %s.", claims, name)
        finally:
            connections.close_all()  # the next child must not inherit this connection

    def _spawn(self, slot: int) -> None:
        pid = os.fork()
        if pid:
            self.children[pid] = slot
            return
        code = 1
        try:
            for signum in (*STOP_SIGNALS, signal.SIGALRM):
                signal.signal(signum, signal.SIG_DFL)
            _die_with_parent()
            options = dict(self.worker_options, name=process_name(self.worker_options.get("name"), os.getpid()))
            code = Worker(**options, supervised=True).run()
        except BaseException:  # noqa: BLE001 - a child must never return into the parent's code
            logger.exception("Worker process %d crashed.", os.getpid())
        finally:
            logging.shutdown()
            os._exit(code)

    def stop_within(self) -> float:
        """Seconds from a stop request to the end of every worker process: the grace for the step
        in flight, the time to find the database silent (a call under way when the grace ends),
        and the time to hand back (process.ABANDON_SECONDS); then the supervisor kills what is left."""
        return shutdown_grace(self.worker_options.get("grace")) + DEAD_PEER_SECONDS + ABANDON_SECONDS

    def _on_signal(self, signum, frame) -> None:
        # (Only flags, kill() and alarm(): it runs between two bytecodes of whatever run() does.)
        self.signals_received += 1
        if self.signals_received == 1:
            signal.alarm(math.ceil(self.stop_within()))
        for pid in list(self.children):
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    def _on_deadline(self, signum, frame) -> None:
        for pid in list(self.children):
            try:
                os.kill(pid, signal.SIGKILL)
                self.killed.add(pid)
            except ProcessLookupError:
                pass


def _ended(code: int) -> str:
    return f"was killed by {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals() \
        else f"exited with {code}"


def _die_with_parent() -> None:
    """Ask Linux to send us SIGTERM if the supervisor dies, so no worker is orphaned."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass
