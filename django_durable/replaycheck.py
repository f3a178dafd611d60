"""A check before deploy: would the code installed now replay the runs in flight?

``manage.py durable check_replay [--since 7d] [--workflow W]`` (and ``check_replay()``) runs each
run's workflow function against its recorded journal, the way a worker replays it, except that
nothing is executed and nothing is written: a recorded step returns its recorded result, and the
first call the journal has no entry for (the run's frontier, where the new code takes over) ends
the check of that run. A run breaks when, before its frontier,

- a recorded key is reached as another kind or another function (NonDeterminismError), or a
  switch's recorded branch is gone;
- the code raises on what was recorded (it now expects another shape of result, say);
- entries the journal holds are not reached by the time the code gets to its frontier or
  returns: a step removed, or one inserted before history the run already has.

A recorded step called with other arguments than it was recorded with breaks too (its entry keeps
a fingerprint of the call). What it cannot see: the arguments of entries written before
fingerprints were, and code that behaves differently on values only known at run time.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.db.models import Q
from django.utils import timezone

from . import conf, registry, retry, serialization, workpool
from .engine.asyncs import call_workflow
from .engine.context import Context
from .interrupts import Interrupt
from .models import Step, WorkflowRun

# Entries whose absence on the new path harms nothing: recorded values, notes, the progress.
_INCIDENTAL = {"note", "log", "progress"}


@dataclass(frozen=True)
class Verdict:
    run_id: str
    workflow: str
    status: str
    ok: bool
    reason: str = ""


class _Frontier(Interrupt):
    """The code reached a call the journal has no entry for: from here the new code takes over."""


class _Claim:
    cancel_requested = False
    lost = False
    attempts = 1

    def __init__(self, run_id, db):
        self.run_id, self.db, self.worker = run_id, db, "check_replay"

    def alive(self) -> bool:
        return True

    def db_now(self):
        return timezone.now()

    def db_passed(self, when) -> bool:
        return False  # no deadline passes during a check

    def db_seconds_until(self, when) -> float:
        return 3600.0


class _Session:
    """Stands in for an advance's session: serves the journal, executes and writes nothing."""

    rolling_back = False
    deadline: dt.datetime | None = None

    def __init__(self, run_id, workflow, db):
        self.claim = _Claim(run_id, db)
        self.workflow, self.db = workflow, db
        self.event_waits: dict = {}

    def now(self):
        return timezone.now()

    def passed(self, when) -> bool:
        return False

    def before_step(self, key, running=None):
        raise _Frontier(key)

    def record(self, record, now=False, derivable=False):
        if now:
            raise _Frontier(record.key)

    def take_message(self, kind, name, key, before=None):
        return None

    def take_stored_event(self, key, name, match, since):
        return None

    def open_approval(self, key, *args):
        raise _Frontier(key)

    def start_child(self, *args, **kwargs):
        raise _Frontier("child")

    def finished_child(self, child_id):
        return None

    def committed(self, records):
        pass

    def attempt_failed(self, key, error, attempt):
        pass

    def alarm(self, deadline, key, *, cancellable=True):
        return contextlib.nullcontext()


if TYPE_CHECKING:  # the type checker holds it to the contract of a context's session
    from .engine.contract import Session

    def _held(session: _Session) -> Session:
        return session


def check_run(run: WorkflowRun, db: str | None = None) -> Verdict:
    """Whether the code installed now replays `run`'s journal as it was recorded."""
    db = db or conf.get("DATABASE")

    def verdict(ok: bool, reason: str = "") -> Verdict:
        return Verdict(str(run.pk), run.workflow, run.status, ok, reason)

    definition = registry.find(run.workflow)
    if definition is None:
        return verdict(False, f"workflow {run.workflow!r} is not registered in this code")
    if definition.kind == "task":
        return verdict(True)  # one call, nothing to replay
    journal = {
        step.key: workpool.StepRecord(step.key, step.seq, step.kind, step.name, step.status, step.result, step.error,
                                      step.attempts, None, None, step.deadline_at, step.retry_at, step.match,
                                      fingerprint=step.fingerprint)
        for step in Step.objects.using(db).filter(run_id=run.pk).order_by("seq")
    }
    arguments = serialization.decode(run.input) or {}
    context = Context(run_id=run.pk, workflow=run.workflow, attempt=run.attempt, journal=journal,
                      session=_Session(run.pk, run.workflow, db),
                      retry=definition.retry or retry.from_setting(conf.get("DEFAULT_RETRY")))
    frontier = None
    try:
        call_workflow(definition.fn, context, arguments.get("args", []), arguments.get("kwargs", {}))
    except _Frontier as reached:
        frontier = str(reached)
    except Interrupt:
        frontier = "a wait"  # it would wait here for what has not happened yet
    except Exception as exc:
        if isinstance(exc, _replayed_failures()) and _recorded_failure(exc, journal):
            frontier = None  # the recorded failure, raised again as recorded
        else:
            return verdict(False, f"{type(exc).__name__}: {exc}"[:500])
    unreached = [key for key, entry in journal.items()
                 if key not in context._used and entry.kind not in _INCIDENTAL and not key.startswith("rollback:")]
    if unreached:
        where = f"before it reaches {frontier!r}" if frontier else "by its end"
        shown = ", ".join(repr(key) for key in unreached[:5]) + (" …" if len(unreached) > 5 else "")
        return verdict(False, f"the journal holds {shown}, which the code no longer reaches {where}")
    return verdict(True)


def _replayed_failures():
    from .exceptions import SignalTimeout, StepFailed

    return (StepFailed, SignalTimeout)


def _recorded_failure(exc, journal) -> bool:
    """A failure replayed from the journal (a step or a wait recorded failed), not a new one."""
    key = getattr(exc, "key", None)
    if key is not None:
        entry = journal.get(key)
        return entry is not None and entry.status == "failed"
    return any(e.status == "failed" and e.kind in ("signal", "event", "approval") for e in journal.values())


def check_replay(*, since: dt.timedelta | None = None, workflow: str | None = None, db: str | None = None):
    """Check every unfinished run, and with `since` those that finished within it too (they may be
    retried); yield a Verdict for each, oldest first."""
    db = db or conf.get("DATABASE")
    wanted = ~Q(status__in=WorkflowRun.TERMINAL)
    if since is not None:
        wanted |= Q(finished_at__gte=timezone.now() - since)
    runs = WorkflowRun.objects.using(db).filter(wanted)
    if workflow:
        runs = runs.filter(workflow=workflow)
    for run in runs.order_by("created_at").iterator(chunk_size=200):
        yield check_run(run, db)
