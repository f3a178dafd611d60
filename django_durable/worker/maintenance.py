"""A worker's second thread: once the main thread has tried its first claim, the declared schedules
synced, then heartbeats, the reaper, due timers and schedules, and two watchdogs.

It has its own database connection, so a long step never delays the heartbeat that keeps its
lease, nor the recovery of other workers' expired claims, nor the timers of sleeping runs.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import random
import socket
import threading
import time

from .. import clock, conf, schedules, workpool
from ..engine import alarm
from . import machine
from .connection import DB_ERRORS, Outage, close_connection, report_lost

logger = logging.getLogger("django_durable.worker")

# The longest the maintenance thread waits for the main thread's first claim (seconds): a first
# claim held up (the database slow to answer) does not hold the schedules and the reaper up longer.
FIRST_CLAIM_WAIT = 1.0


class Maintenance(threading.Thread):
    def __init__(self, worker):
        super().__init__(name="durable-maintenance", daemon=True)
        self.worker = worker
        self.heartbeat = float(conf.get("HEARTBEAT_SECONDS"))
        self.reaper_interval = float(conf.get("REAPER_INTERVAL"))
        self.timer_interval = max(0.05, min(1.0, float(conf.get("POLL_INTERVAL"))))
        self.kill_grace = float(conf.get("STEP_KILL_GRACE_SECONDS"))
        self.cancel_grace = float(conf.get("CANCEL_GRACE_SECONDS"))
        # A cancel reaches a running step within this, whatever the heartbeat: one cheap read.
        self.cancel_poll = min(self.heartbeat, 1.0)
        self.main_thread = threading.main_thread().ident
        self.tick = max(0.02, min(0.25, self.heartbeat / 4, self.timer_interval))
        self.done = threading.Event()
        self.next_timers = time.monotonic()  # when to look for due timers next
        self.next_reap = 0.0
        self.beats: dict = {}  # claim token -> when its lease was last renewed (monotonic)...
        self.polls: dict = {}  # ...and when its run's cancel was last looked for
        self.outage = Outage()
        self.presence = Presence(worker)
        self.stop_told = False  # whether the log says the worker is stopping, its step in flight

    def expect_timer(self, seconds: float) -> None:
        """This worker just set a timer due in `seconds`: look for it then, not a poll later."""
        self.next_timers = min(self.next_timers, time.monotonic() + max(0.0, seconds))

    def run(self) -> None:
        worker = self.worker
        # The main thread's first claim goes first: at a worker's start, the slowest moment of its
        # life, this thread's first queries would compete with it for the interpreter, the cores
        # and the database. It has no claim to renew before then.
        worker.looked.wait(timeout=FIRST_CLAIM_WAIT)
        try:
            schedules.sync_declared()  # every worker does, here after its first claim: idempotent
        except DB_ERRORS as exc:
            logger.warning("Could not sync the declared schedules (%s); the next worker start will.", exc)
            close_connection(worker.db)
        now = time.monotonic()
        self.next_reap = now + random.uniform(0, self.reaper_interval)
        next_report = now
        try:
            while not self.done.wait(max(0.001, min(self.tick, self.next_timers - time.monotonic()))):
                now = time.monotonic()
                if worker.hard_stop or (worker.stop_deadline is not None and now >= worker.stop_deadline):
                    worker.abandon_and_exit("on shutdown")
                claim = worker.current_claim()
                if claim is not None:
                    if worker.stop_deadline is not None and not self.stop_told:
                        self.stop_told = True
                        logger.info("Worker %s is stopping: it lets the step of run %s finish, for up to %.0f s "
                                    "more; a second SIGTERM or Ctrl-C hands the run back at once.",
                                    worker.name, claim.run_id, max(0.0, worker.stop_deadline - now))
                    self._watch(claim, now)
                    self._cancel(claim, now)
                if now < self.outage.retry_at:
                    continue  # the database was away a moment ago: back off, do not storm it
                try:
                    talked = self._beat(claim, now)  # whether this turn spoke to the database
                    talked = self._beat_others(claim, now) or talked
                    if now >= next_report:
                        next_report, talked = now + self.presence.interval, True
                        self.presence.report(claim)
                    if now >= self.next_reap:
                        self.next_reap, talked = now + self.reaper_interval * random.uniform(0.8, 1.2), True
                        workpool.reap(db=worker.db)
                    if now >= self.next_timers:
                        talked = True
                        self._fire_timers(now)
                except DB_ERRORS as exc:
                    close_connection(worker.db)
                    self.outage.failed(exc, f"maintenance of {worker.name}")
                    # Every worker's heartbeats fail as ours do, so their leases run out without
                    # them being lost: no reaping until each had the time to reconnect and renew,
                    # or hand its claim back, rather than see it taken back and counted as a
                    # delivery. Our last failure may come up to one back-off cap before the
                    # database answers again, another worker's first success up to one cap after
                    # it: three caps and a heartbeat leave one cap and a heartbeat to spare (with
                    # a 1 s heartbeat, two caps left one second, which a busy machine overran).
                    self.next_reap = max(self.next_reap, now + 3 * self.outage.backoff.cap + self.heartbeat)
                except Exception:  # noqa: BLE001 - the heartbeat must outlive any one failure
                    logger.exception("Maintenance of worker %s failed; going on.", worker.name)
                else:
                    if talked:  # (a turn with nothing due says nothing of the database)
                        self.outage.ended(f"maintenance of {worker.name}")
        finally:
            try:
                self.presence.report(None, stopped=True)
            except Exception:  # noqa: BLE001 - best effort: the row goes stale by itself
                pass
            close_connection(worker.db)

    def _beat(self, claim, now: float) -> bool:
        """Renew the lease of the claim in flight every heartbeat; between two, learn of a cancel.
        From a poll on, the item is one that runs long (_running_long). Return whether it asked
        the database anything."""
        if claim is None:
            self.beats.clear()
            self.polls.clear()
            return False
        last = self.beats.setdefault(claim.token, now)
        if now - last >= self.heartbeat:
            self.beats[claim.token] = self.polls[claim.token] = now
            lost, known = claim.lost, claim.lost or claim.ending
            if workpool.renew(claim):
                self._running_long(claim)  # (with a heartbeat of a poll or less, the polls below never come first)
            elif not known:
                # (A claim being ended is gone once its end commits: not lost; one the main thread
                # gave up it hands back or reports itself.)
                report_lost(claim, self.worker.name, "will record nothing of the step in progress")
            return not lost  # (renew asks nothing of a claim known lost)
        if (not claim.cancel_requested or not claim.marked) and now - self.polls.setdefault(claim.token, now) >= \
                self.cancel_poll:
            self.polls[claim.token] = now
            self._running_long(claim)
            workpool.check_cancel(claim)
            return True
        return False

    def _running_long(self, claim) -> None:
        """The item in flight is still going a poll or more after it began. Claimed in a batch, it
        left its run as it was: it is written `running`, as a claim of one is at once; the claims
        taken ahead behind it go back to the queue for whichever worker is free first; and the
        completions of its batch that ended before it are written."""
        workpool.mark_running(claim)
        if claim is self.worker.current_claim() and not claim.ending:
            self.worker.give_back_ahead()
            self.worker.flush_behind()

    def _beat_others(self, current, now: float) -> bool:
        """Renew, every heartbeat, the leases of the claims the worker holds besides the one in
        flight: those of a batch taken ahead or ended and not written yet, and those it could not
        hand back. Each lives milliseconds unless the database is away: then, as the one in flight,
        they must outlive the outage, not be taken back as a lost worker's. Return whether it
        asked the database anything."""
        asked, claims = False, self.worker.claims_held()
        kept = {claim.token for claim in claims}
        for token in [token for token in self.beats if token not in kept]:  # ended: forget them
            del self.beats[token]
            self.polls.pop(token, None)
        for claim in claims:
            if claim is current or claim.lost:
                continue
            last = self.beats.setdefault(claim.token, now)
            if now - last >= self.heartbeat:
                self.beats[claim.token] = now
                workpool.renew(claim)
                asked = True
        return asked

    def _fire_timers(self, now: float) -> None:
        """Fire the due timers and schedules; look again when the next is due, or a poll later."""
        db = self.worker.db
        self.next_timers = now + self.timer_interval * random.uniform(0.8, 1.2)
        fired = batch = workpool.fire_timers(db=db)
        while batch >= workpool.TIMER_BATCH:  # a backlog of due timers: keep firing
            batch = workpool.fire_timers(db=db)
            fired += batch
        fired += schedules.tick(db=db)
        if fired:
            self.worker.poke()  # without NOTIFY (SQLite) the main loop would sleep on
        for due_in in (workpool.next_timer_in(db=db), schedules.next_due_in(db=db)):
            if due_in is not None:
                self.expect_timer(due_in)

    def _cancel(self, claim, now: float) -> None:
        """Interrupt the step in progress once its run's cancel has waited out its grace."""
        if not claim.cancel_requested or claim.lost:
            return
        if claim.cancel_seen_at is None:
            claim.cancel_seen_at = now
        if claim.step_active and claim.cancel_sent_at is None and now >= claim.cancel_seen_at + self.cancel_grace:
            claim.cancel_sent_at = now
            logger.warning("Run %s was cancelled %.1f s ago and its step is still running; interrupting it.",
                           claim.run_id, now - claim.cancel_seen_at)
            alarm.interrupt(self.main_thread)

    def _watch(self, claim, now: float) -> None:
        """Replace the process when its step ignores its timeout or its cancel (a C call, a swallowed exception)."""
        deadline = claim.step_deadline
        if claim.cancel_sent_at is not None and claim.step_active:
            deadline = claim.cancel_sent_at if deadline is None else min(deadline, claim.cancel_sent_at)
        if deadline is not None and now > deadline + self.kill_grace:
            logger.error(
                "A step of run %s is still running %.1f s past its deadline (or its cancel) and ignores the "
                "interruption; replacing worker process %s.", claim.run_id, now - deadline, self.worker.name,
            )
            self.worker.abandon_and_exit("stuck past its timeout", replace=True)


class Presence:
    """The worker's row in durable_worker: who it is, when it was last seen, what it is doing.

    Written by the maintenance thread every few seconds (one UPDATE), so the admin can show
    live and stale workers and warn when none is running.
    """

    PRUNE_AFTER = dt.timedelta(days=7)

    def __init__(self, worker):
        self.worker = worker
        self.interval = max(0.5, min(5.0, float(conf.get("HEARTBEAT_SECONDS"))))
        self.started_at = None

    def report(self, claim, stopped: bool = False) -> None:
        from ..models import Worker

        worker, db = self.worker, self.worker.db
        now = clock.db_now()
        fields = {
            "last_seen": now,
            "processed": worker.processed,
            "current": _describe(claim),
            "stopped_at": now if stopped else None,
        }
        if self.started_at is None:
            if stopped:
                return
            self.started_at = now
            Worker.objects.using(db).filter(last_seen__lt=clock.now() - self.PRUNE_AFTER).delete()
            release_dead_neighbours(worker.name, db)  # before this row replaces one of the same name
            Worker.objects.using(db).update_or_create(name=worker.name[:200], defaults=dict(
                fields, host=socket.gethostname()[:200], pid=os.getpid(), machine=machine.identity(),
                queues=",".join(worker.queues or [])[:500], started_at=now,
            ))
        else:
            Worker.objects.using(db).filter(name=worker.name[:200]).update(**fields)


def release_dead_neighbours(name: str, db: str) -> int:
    """Take back at once, fenced, the claims of workers that ran on this machine, in this pid
    namespace, and whose process is gone (a worker killed and started again); return how many.

    Only what is certain: a worker elsewhere, or whose machine is unknown, keeps its claims until
    their leases run out. Called by a worker as it starts (named `name`), before it reports itself.
    """
    from ..models import Worker

    here = machine.identity()
    if not here:
        return 0
    taken = 0
    for other, pid in (Worker.objects.using(db).filter(machine=here, stopped_at__isnull=True)
                       .values_list("name", "pid")):
        if machine.gone(pid):  # this process has not reported itself yet: no row here is its own
            claims = workpool.release_worker(other, why=f"{workpool.PROCESS_GONE} {pid} was gone when {name} started "
                                                        "on the same machine", db=db)
            if claims:
                logger.warning("Took back %d claim(s) of worker %s: its process is gone (same machine).",
                               claims, other)
            taken += claims
    return taken


def _describe(claim) -> str:
    if claim is None:
        return ""
    what = "advancing run" if claim.kind == "advance" else f"running branch {claim.step_key!r} of run"
    return f"{what} {claim.run_id}"[:300]
