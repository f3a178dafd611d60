"""The workpool: claiming work items, leases, fenced writes, a run's transitions, wakeups and reaping.

Every write a worker makes after a claim is conditioned on the claim token it got, so a worker
that lost its lease (paused, partitioned, too slow) changes nothing. Times are the database's
(see clock.py). The locks on runs and their items are taken here, the operator services' too
(through locking.py), always in the workers' order: an item before its run, descendants before
their ancestors. (The scheduler locks schedules, and an approval's decision its approval.)

- claiming.py: taking work (a claim of one item or several, and one given back unused);
  claims.py: the fenced writes under a claim (journal, finish, release, branches);
  holds.py: the Claim they make and take;
- backend.py: the contract of a database's hot path (Backend), which only claiming.py and
  claims.py call;
  postgres.py and queries.py implement it on PostgreSQL, one statement each, named in SQL
  (statements.py sends them: prepared, pipelined);
  sqlite.py with compare-and-set updates (its batch verbs a loop in one transaction);
- runs.py: a run created (with its work item); endings.py: a run ended, with everything its end
  drags along; pending.py: a run back to pending with its item ready (for the services);
- locking.py: the lock order; wakeups.py: wakes, timers and NOTIFY; reaping.py: expired claims;
- messages.py: an event delivered to the runs waiting for it, a kept event taken by a later wait;
- leases.py, rows.py, evidence.py: leases, the named rows, and what a retry would erase;
- listening.py: the sessions that LISTEN, and the wait for a notification.

Nothing in this package calls up into the engine or the services.
"""

from ..journal import StepRecord
from .claiming import ClaimRequest, batches, claim, claim_many, hand_back_unanswered, unclaim
from .claims import (
    Outcome,
    announce_endings,
    check_cancel,
    defer_missing,
    ended_by_itself,
    finish_branch,
    finish_run,
    finish_runs,
    mark_running,
    missing_code_delay,
    note_step,
    record_steps,
    recorded,
    release,
    renew,
    retry_branch,
    retry_run,
    write_endings,
)
from .holds import Batch, Claim, Ending
from .leases import lease_expiry, lease_seconds
from .pending import back_to_pending, hold_paused, ready_branches
from .reaping import PROCESS_GONE, WorkerLost, reap, release_worker
from .rows import RunState
from .wakeups import (
    NOTIFY_CHANNEL,
    TIMER_BATCH,
    announce_end,
    fire_timers,
    held_back,
    next_timer_in,
    notify,
    pending_work,
    wake,
)

__all__ = [
    "NOTIFY_CHANNEL", "PROCESS_GONE", "TIMER_BATCH", "Batch", "Claim", "ClaimRequest", "Ending", "Outcome", "RunState", "StepRecord", "WorkerLost",
    "announce_end", "announce_endings", "back_to_pending", "batches", "check_cancel", "claim", "claim_many", "defer_missing", "ended_by_itself", "finish_branch", "finish_run",
    "finish_runs", "fire_timers", "hand_back_unanswered",
    "held_back", "hold_paused", "ready_branches", "lease_expiry", "lease_seconds", "mark_running", "missing_code_delay", "next_timer_in", "note_step", "notify",
    "pending_work", "reap", "record_steps", "recorded", "release", "release_worker", "renew", "retry_branch",
    "retry_run", "unclaim", "wake", "write_endings",
]
