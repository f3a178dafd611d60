"""A worker process: claim work, advance runs, keep leases alive, recover others' expired claims."""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
from collections import deque
from contextlib import contextmanager

from .. import conf, partitioning, serialization, workpool
from ..checks import check_sqlite_journal
from ..engine import alarm
from ..engine.branches import run_branch
from ..engine.replay import advance
from ..humanize import one_line
from ..interrupts import DatabaseUnavailable, LeaseLost
from ..models import WorkflowRun, WorkItem
from ..workpool import Outcome
from .connection import DB_ERRORS, Backoff, Outage, close_connection, report_lost
from .maintenance import Maintenance
from .waiter import Waiter

logger = logging.getLogger("django_durable.worker")

# The exit code of a worker process that asks its supervisor for a replacement.
EXIT_REPLACE = 75

# An item that took longer than this to run ends the worker's batches, and the claims it took
# ahead are given back: claiming ahead pays only for quick items, and one held behind slow ones
# would wait for each of them in turn while other workers, or this worker's other processes, idle.
# The time the worker's thread spent waiting for a core meanwhile does not count (Worker._stalled):
# on a busy machine a quick item can take longer than this, and the other workers are as busy.
QUICK_SECONDS = 0.02


def waited_for_a_core() -> float | None:
    """Seconds the calling thread has spent runnable but waiting for a core since it started (the
    kernel's schedstat run_delay), or None where the system does not say (not Linux)."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as stats:
            return int(stats.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def shutdown_grace(grace: float | None = None) -> float:
    """Seconds a stopping worker lets its step finish: `grace` (--grace), else DURABLE_SHUTDOWN_GRACE_SECONDS."""
    return float(conf.get("SHUTDOWN_GRACE_SECONDS") if grace is None else grace)


# A stop request: the first stops claiming and lets the step in flight finish, a second hands it back.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# The signals whose handlers the main thread runs: a stop request and the alarm that interrupts a
# step (SIGALRM, from the process's timer). Linux gives a signal sent to the process to any of its
# threads that does not block it; taken by another thread, it leaves the main thread waiting where
# it waits (a step's sleep, a query) until that wait ends by itself, and only then does the handler
# run: a stop request would wait out the step, its grace unkept.
MAIN_THREAD_SIGNALS = frozenset({*STOP_SIGNALS, signal.SIGALRM})


@contextmanager
def main_thread_signals():
    """Block MAIN_THREAD_SIGNALS while the worker's own threads start, so that they inherit the
    block and the kernel gives those signals to the main thread alone (one arriving meanwhile
    waits for the block's end). Outside the main thread, nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, MAIN_THREAD_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def process_name(base: str | None, pid: int) -> str:
    """A worker process's name in claims, logs and the Workers page: `base` (or the host) and its pid."""
    return f"{base or socket.gethostname()}:{pid}"


class Worker:
    """One worker process: a main loop that runs one item at a time, and a maintenance thread.

    The maintenance thread has its own database connection, so a long step never delays the
    heartbeat that keeps its lease, nor the reaper that recovers other workers' expired claims.
    """

    def __init__(self, *, queues=None, burst=False, name=None, db=None, grace=None, supervised=False):
        self.db = db or conf.get("DATABASE")
        self.queues = list(queues) if queues else None
        self.burst = burst
        self.name = name or process_name(None, os.getpid())
        self.grace = shutdown_grace(grace)
        self.supervised = supervised
        self.processed = 0
        self._stopping = threading.Event()
        # Set once the main thread has tried its first claim: the maintenance thread's own start
        # (the declared schedules, this worker's row, the reaper, due timers) waits for it.
        self.looked = threading.Event()
        self.hard_stop = False
        self.stop_deadline: float | None = None
        self._current: workpool.Claim | None = None
        self._next: workpool.Claim | None = None  # claimed by the statement that ended the last item
        self._declined: dict[int, float] = {}  # item id -> until when (monotonic) others go first
        self._unreleased: list[workpool.Claim] = []  # claims a database error kept us from handing back
        # Batches (PostgreSQL, with a backlog of quick items): how many to claim next (1: one at a
        # time, each end claiming the next in its statement), the claims taken ahead, the
        # completions not written yet (one statement for them all, _flush), and those the
        # maintenance thread wrote while an item ran long, whose signals the main thread sends.
        self._size = 1
        self._most = max(1, int(conf.get("CLAIM_BATCH")))
        self._waited_at: float | None = None  # waited_for_a_core() as the batch was claimed (None: no batch)
        self._held: deque[workpool.Claim] = deque()
        # Taken from by the main thread, given back whole by the maintenance thread when the item
        # in flight runs long (give_back_ahead): under this lock, so that no claim is both.
        self._held_lock = threading.Lock()
        self._batch = workpool.Batch()
        self._written: deque[tuple[workpool.Ending, str | None]] = deque()
        self._current_lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        os.set_blocking(self._wake_r, False)

    # -- lifecycle -------------------------------------------------------------------------------

    def run(self) -> int:
        """Process work until stopped (or, with burst, until none is left); return the exit code."""
        self._install_signal_handlers()
        maintenance = self.maintenance = Maintenance(self)
        with main_thread_signals():
            maintenance.start()
        # It listens for notifications when it first runs out of work, not before its first
        # claim, and the maintenance thread begins its work after that claim: neither delays the start.
        waiter = Waiter(self.db, self._wake_r)
        for warning in check_sqlite_journal(databases=[self.db]):
            logger.warning("%s %s", warning.msg, warning.hint)
        try:
            partitioning.runs.layout(self.db, refresh=True)
            if partitioning.layout(self.db, refresh=True) is not None:
                partitioning.make_ahead(self.db)  # idempotent too; the daily durable.prune also makes them
        except DB_ERRORS as exc:
            logger.warning("Could not make the journal's and the runs' partitions ahead (%s).", exc)
            close_connection(self.db)
        logger.info("Worker %s started (queues: %s).", self.name, ", ".join(self.queues or ["all"]))
        backoff, outage = Backoff(), Outage()
        settle = Settle()
        try:
            while not self._stopping.is_set():
                began = time.monotonic()
                try:
                    if self._unreleased:
                        self._hand_back()
                    if given := workpool.hand_back_unanswered(self.db):
                        logger.info("Worker %s gave back %d item(s) it had claimed by a statement whose answer "
                                    "was lost.", self.name, given)
                    if self._run_once():
                        settle.worked(time.monotonic())
                        backoff.reset()
                        if outage.ended(f"worker {self.name}"):
                            waiter.listen()  # now, not when next idle: it may be busy a while
                        continue
                    if self.burst and not workpool.pending_work(queues=self.queues, db=self.db):
                        break
                    outage.ended(f"worker {self.name}")
                except DB_ERRORS as exc:
                    close_connection(self.db)
                    # The listening session is likely gone with the server: listen again at the
                    # next wait, not when a wait on the dead socket finds it so.
                    waiter.reset()
                    waiter.sleep(outage.failed(exc, f"worker {self.name}"))
                    continue
                except Exception:  # noqa: BLE001 - a worker outlives its own bugs
                    logger.exception("Worker %s failed; going on after a pause.", self.name)
                    waiter.sleep(backoff.next())
                    continue
                if waiter.begins_listening():
                    continue  # what was notified before it began went unheard: look once more first
                waiter.wait(settle.wait(self._idle_seconds(), began, time.monotonic()))
        finally:
            try:
                self._flush()
            except DB_ERRORS:  # (its claims wait in _unreleased)
                close_connection(self.db)
            self._release_held()
            try:
                self._hand_back()
            except DB_ERRORS:  # still away: their leases run out and the reaper takes them back
                close_connection(self.db)
            if self._next is not None:  # claimed while the stop request arrived: hand it back
                try:
                    workpool.release(self._next, run_status=WorkflowRun.Status.PENDING)
                except DB_ERRORS:
                    close_connection(self.db)
                self._next = None
            self.looked.set()  # (stopped before its first claim)
            maintenance.done.set()
            maintenance.join(timeout=5)
            try:  # (a write of the maintenance thread's that ended as it stopped)
                self._announce_written()
            except DB_ERRORS:
                close_connection(self.db)
            waiter.close()
            close_connection(self.db)
        logger.info("Worker %s stopped after %d item(s).", self.name, self.processed)
        return 0

    def stop(self) -> None:
        """Stop claiming; the item in flight finishes its step or is released after the grace."""
        if not self._stopping.is_set():
            self.stop_deadline = time.monotonic() + self.grace
            self._stopping.set()
        else:
            self.hard_stop = True
        self.poke()

    def poke(self) -> None:
        """Wake the main loop if it is waiting for work."""
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass

    def _idle_seconds(self) -> float:
        """How long to wait for work after a claim found none: the poll interval, or briefly when
        a queue's limits hold back ready work (a slot frees, or the rate allows the next claim,
        without a notification)."""
        poll = float(conf.get("POLL_INTERVAL"))
        if workpool.held_back(queues=self.queues, db=self.db):
            return min(poll, LIMITED_POLL)
        return min(poll, 0.2) if self.burst else poll

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        alarm.install()  # step timeouts, and cancels sent by the maintenance thread
        # The handler only sets flags: it runs between bytecodes of whatever the main thread
        # does (a query, a step), so it must not touch the database or take locks.
        for signum in STOP_SIGNALS:
            signal.signal(signum, lambda *_: self.stop())

    # -- the main loop ---------------------------------------------------------------------------

    def _chain(self) -> workpool.ClaimRequest | None:
        """What to claim in the statement that ends the current item: nothing once stopping, in
        batches (claim_many claims the next ones), or while claims taken ahead wait their turn."""
        if self._stopping.is_set() or self._size > 1 or self._held:
            return None
        return workpool.ClaimRequest(self.name, self.queues, self._avoid())

    # -- batches ---------------------------------------------------------------------------------

    def _take(self) -> workpool.Claim | None:
        """The next claim to run: one taken ahead, the one the last end claimed, or a new claim
        (several at once in batches)."""
        while True:
            with self._held_lock:
                claim = self._held.popleft() if self._held else None
            if claim is None:
                break
            if claim.lost:  # (taken back meanwhile: its renewal found it gone)
                continue
            if claim.valid_until - time.monotonic() > workpool.lease_seconds() / 2:
                return claim
            # Too little of its lease left to start it: give it back, in its place, for another worker.
            self._size = 1
            workpool.unclaim([claim, *self._ahead()])
        claim, self._next = self._next, None
        if claim is not None:
            return claim
        self._flush()  # before claiming anew (and so before idling): the batch's completions
        if self._size > 1 and not workpool.batches(self.db, self.queues):
            self._size = 1  # a queue it serves was given limits at runtime: one claim at a time
        if self._size > 1:
            claims = workpool.claim_many(worker=self.name, queues=self.queues, db=self.db, k=self._size)
            self._waited_at = waited_for_a_core()
            # A full batch means a backlog: take more next time; fewer, and the queue is nearly
            # empty: one at a time again, so that a lone item is not kept waiting for company.
            self._size = min(self._most, 2 * self._size) if len(claims) == self._size else 1
            with self._held_lock:
                self._held.extend(claims[1:])
            return claims[0] if claims else None
        self._waited_at = None
        return workpool.claim(worker=self.name, queues=self.queues, db=self.db, avoid=self._avoid())

    def _paced(self, claim: workpool.Claim, seconds: float) -> None:
        """After an item: go to batches when the statement that ended a quick one found another
        ready (a backlog), back to one at a time after a slow one, giving back the claims taken
        ahead (in their places, not deliveries) for whichever worker is free first."""
        if seconds > QUICK_SECONDS and seconds - self._stalled() > QUICK_SECONDS:
            self._size = 1
            self._release_held()
        elif self._size == 1 and claim.next_claim is not None and self._most > 1 and not self._declined:
            if workpool.batches(self.db, self.queues):  # (a queue given limits at runtime stops them)
                self._size = 2

    def _stalled(self) -> float:
        """Seconds this thread waited for a core (CPU contention, a CPU quota) since its batch was
        claimed or its last slow item ended: 0.0 outside batches, or where the system does not say.
        Counted from the batch's start, not the item's, so that reading it costs nothing on quick
        items: an item slow by itself is taken for quick only where the batch's earlier items
        waited about as long as it ran, and the maintenance thread still gives the claims taken
        ahead back a poll after it began."""
        if self._waited_at is None:
            return 0.0
        waited = waited_for_a_core()
        if waited is None:
            return 0.0
        stalled, self._waited_at = waited - self._waited_at, waited
        return stalled

    def _flush(self) -> None:
        """Write the completions waiting in the batch, in one statement (workpool.finish_runs)."""
        self._announce_written()
        try:
            finals = self._write_batch(workpool.finish_runs)
        except DB_ERRORS:
            # Not written: kept, and written once the database answers, while the heartbeat
            # renews their claims (an outage is not a lost worker). A claim lost meanwhile is
            # found so by the fenced write, and its run goes again: at least once.
            close_connection(self.db)
            raise
        self._hand_back_lost(finals)

    def flush_behind(self) -> None:
        """Write the completions waiting in the batch while the item in flight runs long (called
        by the maintenance thread), so that a run that ended in a millisecond is not shown
        unfinished, nor run again after a crash, for as long as a slow one behind it runs. What
        follows their commit (their signals, user code) is left to the main thread (_flush); a
        failed write leaves them for its next flush, or the next poll."""
        self._written.extend(self._write_batch(workpool.write_endings))

    def _write_batch(self, write) -> list[tuple[workpool.Ending, str | None]]:
        """`write` the batch's completions, taken whole; kept in the batch if it fails."""
        batch = self._batch.take()
        if not batch:
            return []
        try:
            finals = write(batch)
        except DB_ERRORS:
            self._batch.put_back(batch)
            raise
        self._batch.written(batch)
        return finals

    def _announce_written(self) -> None:
        """What follows the commit of the completions the maintenance thread wrote (flush_behind)."""
        if not self._written:
            return
        finals = [self._written.popleft() for _ in range(len(self._written))]
        workpool.announce_endings(finals)
        self._hand_back_lost(finals)

    def _hand_back_lost(self, finals: list[tuple[workpool.Ending, str | None]]) -> None:
        """Report the completions of a batch whose claims were lost (a fenced release of each)."""
        lost = [ending.claim for ending, final in finals if final is None]
        if lost:
            self._unreleased.extend(lost)
            self._hand_back()  # (a fenced release: reports each claim lost)

    def _release_held(self) -> None:
        """give_back_ahead(), where the worker goes on (or stops) whether or not the database answers."""
        try:
            self.give_back_ahead()
        except DB_ERRORS:  # (given back once it answers: workpool.hand_back_unanswered)
            close_connection(self.db)

    def _ahead(self) -> list[workpool.Claim]:
        """The claims taken ahead, out of the worker's hands (the caller gives them back)."""
        with self._held_lock:
            held = list(self._held)
            self._held.clear()
        return held

    def _avoid(self) -> tuple[int, ...]:
        """The items this worker handed back for lack of their code, while a worker that has it goes first."""
        if not self._declined:
            return ()
        now = time.monotonic()
        self._declined = {item: until for item, until in self._declined.items() if until > now}
        return tuple(sorted(self._declined))

    def _run_once(self) -> bool:
        try:
            claim = self._take()
        finally:
            if not self.looked.is_set():
                self.looked.set()
        if claim is None:
            return False
        with self._current_lock:
            self._current = claim
        if self._size > 1 and claim.kind == WorkItem.Kind.ADVANCE:
            claim.batch = self._batch  # its completion waits for the batch's statement
        began = time.monotonic()
        try:
            try:
                if claim.kind == WorkItem.Kind.ADVANCE:
                    outcome = advance(claim, should_stop=self._stopping.is_set, chain=self._chain)
                elif claim.kind == WorkItem.Kind.STEP:
                    outcome = run_branch(claim, chain=self._chain)
                else:
                    raise ValueError(f"Work item {claim.item_id} has kind {claim.kind!r}, which this worker cannot run.")
            except LeaseLost:
                # Whatever kind of item, wherever the engine noticed: the claim is gone, so
                # this worker writes nothing more for it and goes on with other work.
                claim.lost, outcome = True, Outcome.LOST
            if outcome == Outcome.LOST:
                # Lost to the database (the fence failed), or only on this side (the lease ran out
                # by this process's clock while the database was away or the process paused):
                # a fenced release tells which, and in the second case hands the run on now.
                self._unreleased.append(claim)
                self._hand_back()
            elif outcome == Outcome.DEFERRED:
                self._declined[claim.item_id] = time.monotonic() + 2 * workpool.missing_code_delay()
        except DB_ERRORS as exc:
            if refused(exc):
                self._fail_refused(claim, exc)
                return True
            # Hand the run back so another worker (or we, once reconnected) goes on at once
            # rather than after the lease; the release is fenced, so it is safe to try. With the
            # database away, it is tried again as soon as the database answers (_hand_back): an
            # outage is not a lost worker, so it must not cost the run one of its deliveries.
            close_connection(self.db)
            if claim not in self._unreleased:  # (a hand-back of a lost claim may be what failed)
                self._unreleased.append(claim)
            self._hand_back()
            raise
        except Exception:
            # A bug of ours, not the workflow's (those end the run). Treat it like a crash: let
            # the lease lapse, so the item is delivered again and, if it keeps failing, ends
            # failed after DURABLE_MAX_DELIVERIES instead of looping here.
            logger.error("Worker %s abandoned its claim on run %s%s after an error of the engine: %s "
                         "(it is delivered again when its lease runs out).", self.name, claim.run_id,
                         f" step {claim.step_key!r}" if claim.step_key else "", one_line(sys.exc_info()[1]),
                         exc_info=logger.isEnabledFor(logging.DEBUG))
            claim.lost = True
        finally:
            if claim.earliest_timer is not None:
                self.maintenance.expect_timer((claim.earliest_timer - claim.db_now()).total_seconds())
            # Set by the statement that ended this item, even if something failed after it.
            self._next = claim.next_claim
            with self._current_lock:  # (a claim still to hand back keeps its heartbeat)
                self._current = self._next or (self._unreleased[0] if self._unreleased else None)
            self.processed += 1
            self._paced(claim, time.monotonic() - began)
        if self._batch and (not self._held or len(self._batch) >= self._most):
            self._flush()
        return True

    def _hand_back(self) -> None:
        """Release, fenced, the claims this worker gave up without handing them back: a database
        error kept it from writing, or it took the claim for lost by its own clock.

        Meanwhile the maintenance thread keeps renewing their leases (current_claim), so that no
        reaper takes them back as a lost worker's: an outage is not a lost worker, and must not
        cost a run one of its DURABLE_MAX_DELIVERIES. One taken all the same is gone: the
        release writes nothing, and the loss is reported.
        """
        while self._unreleased:
            claim = self._unreleased[0]
            what = f"branch {claim.step_key!r} of run {claim.run_id}" if claim.kind == WorkItem.Kind.STEP \
                else f"run {claim.run_id}"
            try:
                held = workpool.release(claim, run_status=WorkflowRun.Status.PENDING)
                ended = not held and workpool.ended_by_itself(claim)
            except DB_ERRORS:
                close_connection(self.db)
                raise
            if held:
                logger.info("Worker %s handed %s back; it goes on from its last checkpoint.", self.name, what)
            elif ended:
                # No one took it: its end committed before the error that hid the answer.
                logger.info("Worker %s found %s already ended by its own end, whose answer was lost; "
                            "nothing to hand back.", self.name, what)
            else:
                report_lost(claim, self.name, "abandoned it")
            self._unreleased.pop(0)
            with self._current_lock:
                if self._current is claim:
                    self._current = None

    def _fail_refused(self, claim: workpool.Claim, exc: BaseException) -> None:
        """The database refused the engine's own write for its data (a damaged row, a value out
        of range): handing the run back would loop for ever, so the run fails, fenced, saying why."""
        close_connection(self.db)
        cause = exc.__cause__ or exc
        error = serialization.dumps_error(RunDamaged(
            f"The engine could not record this run's progress: the database refused it "
            f"({type(cause).__name__}: {str(cause).strip()[:500]}). Its stored rows may be damaged; "
            f"repair them and retry the run."
        ))
        logger.error("Run %s failed: the database refused the engine's write (%s).", claim.run_id, one_line(cause))
        try:
            if claim.kind == WorkItem.Kind.ADVANCE:
                workpool.finish_run(claim, status=WorkflowRun.Status.FAILED, result=None, error=error)
            else:
                claim.lost = True  # a branch: its lease lapses and it is delivered again, then fails as poison
        except DB_ERRORS:
            close_connection(self.db)
            claim.lost = True

    # -- called by the maintenance thread ---------------------------------------------------------

    def current_claim(self) -> workpool.Claim | None:
        with self._current_lock:
            return self._current

    def give_back_ahead(self) -> None:
        """Give back, fenced, the claims taken ahead and not started (in their places, not
        deliveries, idle workers told): the item in flight runs long or ended slow, or the worker
        is stopping. None of them starts here after, whether or not the database answers
        (workpool.unclaim)."""
        workpool.unclaim(self._ahead())

    def claims_held(self) -> list[workpool.Claim]:
        """Every claim this worker holds besides none: the one in flight, those taken ahead, those
        ended in a batch not written yet, and those to hand back (the heartbeat renews them all)."""
        held = [*list(self._held), *self._batch.claims(), *list(self._unreleased)]
        if self._next is not None:
            held.append(self._next)
        current = self.current_claim()
        return [current, *held] if current is not None else held

    def abandon_and_exit(self, why: str, *, replace: bool = False) -> None:
        """Release the run in flight (fenced) so another worker resumes it now, then end this process.

        With `replace`, the process is replaced by a fresh worker: under a supervisor it exits
        with EXIT_REPLACE and the supervisor starts another; alone it re-executes itself.
        """
        # Handing back needs the database, which may not answer (a cut network): past
        # ABANDON_SECONDS the process ends anyway, and the claims return when their leases run out.
        if self.maintenance.outage.since is not None:  # the database is away: nothing to hand back to
            self._exit(replace)
        deadline = threading.Timer(ABANDON_SECONDS, self._exit, (replace,))
        deadline.daemon = True
        deadline.start()
        claim = self.current_claim()
        if claim is not None:
            try:
                if workpool.release(claim, run_status=WorkflowRun.Status.PENDING):
                    logger.warning("Worker %s released run %s mid-step (%s).", self.name, claim.run_id, why)
            except Exception:  # noqa: BLE001 - ending anyway; the lease covers a failed release
                logger.exception("Worker %s could not release run %s.", self.name, claim.run_id)
        try:  # taken ahead, not started: ready at once for another worker, in their places
            workpool.unclaim(self._ahead())
        except Exception:  # noqa: BLE001 - as above
            pass
        self._exit(replace)

    def _exit(self, replace: bool) -> None:
        logging.shutdown()
        if not replace:
            os._exit(0)
        if self.supervised:
            os._exit(EXIT_REPLACE)
        # The stuck thread cannot be stopped, only the process: run the same command afresh.
        os.execv(sys.executable, sys.orig_argv)


class Settle:
    """When a worker that ran out of work looks once more: at SETTLE_SECONDS after its last work,
    whatever wakes it before then. A start that committed just after its last claim may not have
    notified (see SETTLE_SECONDS); a notification heard sooner, perhaps one sent while the worker
    was busy for a run it has taken since, makes it look sooner and then wait on for that look."""

    def __init__(self) -> None:
        self.at: float | None = None  # the last work's time.monotonic() plus SETTLE_SECONDS

    def worked(self, now: float) -> None:
        self.at = now + SETTLE_SECONDS

    def wait(self, idle: float, began: float, now: float) -> float:
        """Seconds to wait, at most `idle`, after a look that began at `began` found no work."""
        if self.at is None or began >= self.at:
            self.at = None
            return idle
        return min(idle, max(self.at - now, 0.0))


class RunDamaged(Exception):
    """The database refused the engine's write for a run (recorded as the run's error)."""


def refused(exc: BaseException) -> bool:
    """True if the database refused a statement for its data (not a lost connection, not a
    conflict of the moment): trying it again would fail again."""
    from django.db import DataError, IntegrityError

    cause = exc.__cause__ if isinstance(exc, DatabaseUnavailable) else exc
    return isinstance(cause, (DataError, IntegrityError))


# Seconds a worker that gives up its step (past the grace, or stuck) tries to hand it back before
# it ends anyway.
ABANDON_SECONDS = 5.0

# Seconds between claims while a queue's limits hold back ready work.
LIMITED_POLL = 0.05

# Seconds after its last work a worker that ran out of it looks once more (then waits for the
# poll interval): a start skips its NOTIFY when it sees a ready item not yet claimed
# (queries.START_NOTIFY_IF_IDLE), or when another start in its process saw one a moment before
# (workpool.runs.READY_SEEN_SECONDS), and that item may be the last one this worker took.
SETTLE_SECONDS = 0.05
