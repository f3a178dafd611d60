"""Repairs by filter: retry, rerun from a step, cancel or force-fail every run that matches a filter.

First plan(): how many runs match, how many of them the action may take (a retry takes failed,
timed-out, cancelled, blocked and paused runs; a cancel or a forced failure unfinished ones), and a sample.
Then start(): the built-in workflow ``durable.repair`` applies the action to the runs the plan saw
(those whose id is at most the newest one matched then), a batch at a time (its runs picked in
one step, the action applied in the next), each run through the same service the run page uses, in
a transaction of its own, audited with who asked. A worker stopped halfway goes on where it was,
and a batch done again changes and counts each run once; a run that no longer matches (someone retried it
meanwhile) is left alone, and one its service refuses is counted with the reason.

``durable.repair`` never repairs its own runs.
"""

from __future__ import annotations

import datetime as dt
import itertools
import uuid
from dataclasses import asdict, dataclass
from typing import Any, Callable

from django.db.models import QuerySet
from django.utils.dateparse import parse_datetime

from .. import conf, registry
from ..exceptions import DurableError, InvalidArguments, RunFinished
from ..models import WorkflowEvent, WorkflowRun

REPAIR_WORKFLOW = "durable.repair"
Status = WorkflowRun.Status
UNFINISHED = tuple(status for status in Status.values if status not in WorkflowRun.TERMINAL)
ERRORED = tuple(sorted(WorkflowRun.TERMINAL - {Status.COMPLETED}))


def _retry(pk, reason: str, from_step: str, by: str) -> None:
    from .control import retry_run

    retry_run(pk, by=by)


def _cancel(pk, reason: str, from_step: str, by: str) -> None:
    from .control import cancel

    cancel(pk, reason or None, by=by)


def _force_fail(pk, reason: str, from_step: str, by: str) -> None:
    from .control import force_fail

    force_fail(pk, reason or None, by=by)


def _fork(pk, reason: str, from_step: str, by: str) -> None:
    from .control import fork

    fork(pk, from_step=from_step, by=by)


@dataclass(frozen=True)
class Repair:
    """One action by filter: the service it calls on each run, the statuses it takes runs from
    (None: any), and the permission it needs (the same as on one run)."""

    name: str
    verb: str
    apply: Callable[[Any, str, str, str], None]
    statuses: tuple[str, ...] | None
    permission: str
    event: str  # the audit entry the action writes on each run (WorkflowEvent.Type)


REPAIRS = {repair.name: repair for repair in (
    Repair("retry", "retried", _retry, (Status.FAILED, Status.TIMED_OUT, Status.CANCELLED, *WorkflowRun.HELD),
           "retry_workflowrun", WorkflowEvent.Type.RETRIED),
    Repair("rerun", "rerun from the step", _fork, None, "start_workflowrun", WorkflowEvent.Type.FORKED),
    Repair("cancel", "cancelled", _cancel, UNFINISHED, "cancel_workflowrun", WorkflowEvent.Type.CANCELLED),
    Repair("force-fail", "forced to fail", _force_fail, UNFINISHED, "forcefail_workflowrun",
           WorkflowEvent.Type.FORCE_FAILED),
)}


def repair_of(name: str) -> Repair:
    """The Repair named `name`; InvalidArguments naming the ones there are for anything else."""
    if name not in REPAIRS:
        raise InvalidArguments(f"There is no repair {str(name)[:40]!r}: use one of {', '.join(REPAIRS)}.")
    return REPAIRS[name]


@dataclass(frozen=True)
class RunFilter:
    """Which runs: every condition given must hold (none given: every run, which is refused)."""

    workflow: str = ""
    statuses: tuple[str, ...] = ()
    queue: str = ""
    created_after: dt.datetime | None = None
    created_before: dt.datetime | None = None
    error: str = ""  # a piece of the error's text (its type, its message)

    @classmethod
    def parse(cls, data: dict) -> RunFilter:
        """A filter from data (the API's JSON, a form's, the command line's), checked:
        InvalidArguments naming what is wrong."""
        if not isinstance(data, dict):
            raise InvalidArguments("A filter is an object such as {\"workflow\": \"shop.order\", \"status\": \"failed\"}.")
        known = {"workflow", "status", "queue", "created_after", "created_before", "error"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidArguments(f"A filter has no {unknown[0]!r}: use {', '.join(sorted(known))}.", argument=unknown[0])
        status = data.get("status") or ()
        statuses = tuple([status] if isinstance(status, str) else status if isinstance(status, (list, tuple)) else [status])
        wrong = [s for s in statuses if not isinstance(s, str) or s not in Status.values]
        if wrong:
            raise InvalidArguments(f"{str(wrong[0])[:40]!r} is not a run status: use {', '.join(Status.values)}.",
                                   argument="status")
        times = {}
        for name in ("created_after", "created_before"):
            value = data.get(name)
            if value in (None, ""):
                times[name] = None
                continue
            try:
                moment = value if isinstance(value, dt.datetime) else parse_datetime(str(value))
            except ValueError:  # well formed, not a date: 2026-13-45
                moment = None
            if moment is None or moment.tzinfo is None:
                raise InvalidArguments(f"{name} is a date and time with its time zone, such as "
                                       f"2026-11-28T09:00:00+00:00, not {value!r}.", argument=name)
            times[name] = moment
        for name in ("workflow", "queue", "error"):
            if not isinstance(data.get(name) or "", str):
                raise InvalidArguments(f"{name} is a string, not {data[name]!r}.", argument=name)
        found = cls(workflow=data.get("workflow") or "", statuses=statuses, queue=data.get("queue") or "",
                    error=data.get("error") or "", **times)
        if found == cls():
            raise InvalidArguments("Give at least one condition (workflow, status, queue, a time range or error "
                                   "text): a repair of every run is not taken.")
        return found

    def as_data(self) -> dict:
        """JSON-ready, as parse() reads it back."""
        data = asdict(self)
        data["status"] = list(data.pop("statuses"))
        for name in ("created_after", "created_before"):
            data[name] = data[name].isoformat() if data[name] else None
        return {name: value for name, value in data.items() if value}

    def runs(self, db: str) -> QuerySet:
        """The runs that match (never the repairs' own)."""
        # An error is kept by a run that ended otherwise than completed: without statuses, an error's
        # text is looked for among those (through the status index), not in every run there is.
        statuses = self.statuses or (ERRORED if self.error else ())
        lookups = {"workflow": self.workflow, "status__in": statuses, "queue": self.queue,
                   "created_at__gte": self.created_after, "created_at__lt": self.created_before,
                   "error__icontains": self.error}
        return WorkflowRun.objects.using(db).exclude(workflow=REPAIR_WORKFLOW).filter(
            **{lookup: value for lookup, value in lookups.items() if value})

    def __str__(self) -> str:
        parts = [f"workflow {self.workflow}" if self.workflow else "",
                 f"status {' or '.join(self.statuses)}" if self.statuses else "",
                 f"queue {self.queue}" if self.queue else "",
                 f"created from {self.created_after:%Y-%m-%d %H:%M:%S}" if self.created_after else "",
                 f"created before {self.created_before:%Y-%m-%d %H:%M:%S}" if self.created_before else "",
                 f"error containing {self.error!r}" if self.error else ""]
        return ", ".join(part for part in parts if part)


@dataclass
class Plan:
    """What a repair would change: how many runs match, how many the action may take, a sample of
    those, and the newest id among them (the repair goes no further)."""

    repair: str
    filter: RunFilter
    matched: int
    eligible: int
    sample: list[dict]
    until: str | None

    def as_data(self) -> dict:
        return {"repair": self.repair, "filter": self.filter.as_data(), "matched": self.matched,
                "eligible": self.eligible, "sample": self.sample, "until": self.until}


def _eligible(repair: Repair, runs: QuerySet) -> QuerySet:
    return runs if repair.statuses is None else runs.filter(status__in=repair.statuses)


def plan(name: str, run_filter: RunFilter, *, from_step: str = "", sample: int = 10) -> Plan:
    """Count and sample what `name` would change for `run_filter`; change nothing."""
    repair = repair_of(name)
    if name == "rerun" and not from_step:
        raise InvalidArguments("A rerun from a step needs the step's key (from_step).", argument="from_step")
    db = conf.get("DATABASE")
    runs = run_filter.runs(db)
    eligible = _eligible(repair, runs)
    shown = list(eligible.order_by("-pk").values("id", "workflow", "status", "queue", "created_at")[:sample])
    return Plan(name, run_filter, matched=runs.count(), eligible=eligible.count(),
                sample=[dict(row, id=str(row["id"]), created_at=row["created_at"].isoformat()) for row in shown],
                until=(lambda top: None if top is None else str(top))(
                    eligible.order_by("-pk").values_list("pk", flat=True).first()))


def start(name: str, run_filter: RunFilter, *, by: str, reason: str = "", from_step: str = "",
          batch: int = 200) -> tuple[WorkflowRun, Plan]:
    """Plan the repair, then start the run of ``durable.repair`` that applies it; return both."""
    from .runs import start_run

    planned = plan(name, run_filter, from_step=from_step, sample=0)
    if not 1 <= batch <= 5000:
        raise InvalidArguments(f"A batch is 1 to 5,000 runs, not {batch}.", argument="batch")
    run = start_run(REPAIR_WORKFLOW, [], {"repair": name, "filter": run_filter.as_data(), "until": planned.until,
                                          "by": by, "reason": reason, "from_step": from_step, "batch": batch,
                                          "total": planned.eligible}, by=by)
    return run, planned


def plan_repair(action: str, /, *, from_step: str = "", **conditions) -> dict:
    """What `action` ("retry", "rerun", "cancel", "force-fail") would change for the runs matching
    `conditions` (workflow=, status= one or a list, queue=, created_after=, created_before=, error=):
    {"matched", "eligible", "sample", "until", ...}. Changes nothing."""
    return plan(action, RunFilter.parse(conditions), from_step=from_step).as_data()


def repair(action: str, /, *, by: str | None = None, reason: str = "", from_step: str = "", batch: int = 200,
           **conditions) -> WorkflowRun:
    """Start the durable.repair run that applies `action` to the runs matching `conditions` (as
    plan_repair() counts them), `batch` runs a step; return it. `by` goes into each run's audit trail."""
    run, _ = start(action, RunFilter.parse(conditions), by=by or "", reason=reason, from_step=from_step, batch=batch)
    return run


def reason_of(exc: DurableError) -> str:
    """A short reason a service refused a run, to count alike ones together."""
    if isinstance(exc, RunFinished):
        return "already finished"
    text = str(exc)
    if "only a failed" in text:
        return "not failed, timed out or cancelled"
    if "not compensation_failed" in text:
        return "not compensation_failed"
    if "no pending timer" in text:
        return "nothing to wake"
    if "is not stuck" in text:
        return "not stuck"
    return type(exc).__name__


def pick_batch(name: str, filter_data: dict, *, after: str | None, until: str, batch: int = 200) -> list[str]:
    """The next `batch` runs after the id `after` (up to `until`) that match and that the repair may
    take, by id: a step of their own, so that the batch a retried step applies to is this one."""
    repair = repair_of(name)
    db = conf.get("DATABASE")
    runs = _eligible(repair, RunFilter.parse(filter_data).runs(db)).filter(pk__lte=until)
    if after is not None:
        runs = runs.filter(pk__gt=after)
    return [str(pk) for pk in runs.order_by("pk").values_list("pk", flat=True)[:batch]]


def apply_batch(name: str, ids: list[str], *, by: str, reason: str = "", from_step: str = "",
                since: str | None = None) -> dict:
    """Apply the repair to each of the runs `ids`; return {"done", "skipped": {reason: count}}.

    Done again (its step retried after a failure part way, or after a crash), it counts as done
    the runs this repair changed already, which its audit trail says (an entry of the action by
    `by` since `since`, this repair's start; for a rerun, a fork made since), and changes them no
    more: each run is changed once, and counted once."""
    repair = repair_of(name)
    db = conf.get("DATABASE")
    if since is None:
        changed = set()
    elif name == "rerun":
        changed = set(WorkflowRun.objects.using(db).filter(forked_from__in=ids, created_at__gte=since)
                      .values_list("forked_from", flat=True))
    else:
        changed = set(WorkflowEvent.objects.using(db).filter(run_id__in=ids, type=repair.event, actor=by,
                                                             at__gte=since).values_list("run_id", flat=True))
    done, skipped = 0, {}
    for pk in ids:
        if uuid.UUID(pk) in changed:
            done += 1
            continue
        try:
            repair.apply(pk, reason, from_step, by)
        except DurableError as exc:
            why = reason_of(exc)
            skipped[why] = skipped.get(why, 0) + 1
        else:
            done += 1
    return {"done": done, "skipped": skipped}


def repair_workflow(ctx, repair: str, filter: dict, until: str | None, by: str, reason: str = "",
                    from_step: str = "", batch: int = 200, total: int = 0) -> dict:
    """The built-in workflow: a repair by filter, each batch two steps (its runs picked, then the
    action applied to them: see this module's docstring)."""
    done, skipped, after = 0, {}, None
    verb = REPAIRS[repair].verb if repair in REPAIRS else str(repair)
    since = str(ctx.step("since", _now))
    if until is not None:
        for n in itertools.count(1):
            ids = ctx.step(f"pick {n}", pick_batch, repair, filter, after=after, until=until, batch=batch)
            if ids:
                result = ctx.step(f"apply {n}", apply_batch, repair, ids, by=by, reason=reason, from_step=from_step,
                                  since=since)
                done += result["done"]
                for why in result["skipped"]:
                    skipped[why] = skipped.get(why, 0) + result["skipped"][why]
                ctx.set_progress(done + sum(skipped.values()), total or None, f"{done} {verb}")
            if len(ids) < batch:
                break
            after = ids[-1]
    return {"repair": repair, "filter": filter, "done": done, "skipped": skipped}


def _now() -> str:
    from .. import clock

    return clock.database_now(conf.get("DATABASE")).isoformat()


def register_repair() -> None:
    """Register durable.repair (no schedule: operators start it, through start())."""
    registry.register(registry.WorkflowDefinition(name=REPAIR_WORKFLOW, fn=repair_workflow, queue="default"))
