"""Deleting what is no longer needed: finished runs past their retention, and kept events.

A finished run is kept for its workflow's ``retention`` (``@durable.workflow(retention=...)``), or
DURABLE_RETENTION; an emitted event for DURABLE_EVENT_RETENTION. The prune deletes them in batches,
one short transaction each (the runs' ids, oldest first, then their rows and everything that hangs
off them), so it never holds a lock for long and can stop anywhere. It runs by itself: the built-in
workflow ``durable.prune`` has a schedule (DURABLE_PRUNE_SCHEDULE, daily by default) that every
worker declares at start-up, shown and pausable with the others; ``manage.py durable prune`` runs
it by hand.

Where the runs table is partitioned (PostgreSQL, partitioning/runs.py), the prune drops a past
partition whole once every run in it is past its retention, after deleting what hangs off those
runs in other tables in batches: no dead tuples in the runs table or the journal. Runs are then
deleted one by one only where that cannot be: in the partition of the runs from before the
conversion, and a run past its retention by more than one interval (a neighbour kept longer, or
unfinished, holds its partition). So a run stays at most its retention plus one interval.
`--older-than` deletes exactly the runs it names, as on a plain table.
"""

from __future__ import annotations

import datetime as dt
import itertools
from dataclasses import dataclass, field


from . import clock, conf, partitioning, payloads, registry

PRUNE_WORKFLOW = "durable.prune"


@dataclass
class Cohort:
    """Finished runs of `workflows` (None: every workflow not in `others`) kept for `retention`."""

    retention: dt.timedelta
    workflows: list[str] | None = None
    others: list[str] = field(default_factory=list)

    def runs(self, now: dt.datetime, grace: dt.timedelta | None = None):
        """The cohort's runs past their retention; with `grace`, of those in time partitions only
        the ones past it by `grace` too (the others go with their partition)."""
        from django.db.models import Q

        from .models import EPOCH, WorkflowRun

        old = WorkflowRun.objects.filter(status__in=WorkflowRun.TERMINAL, finished_at__lt=now - self.retention)
        if grace is not None:
            old = old.filter(Q(id_time=EPOCH) | Q(finished_at__lt=now - self.retention - grace))
        if self.workflows is not None:
            return old.filter(workflow__in=self.workflows)
        return old.exclude(workflow__in=self.others) if self.others else old

    def kept_sql(self, now: dt.datetime) -> tuple[str, list]:
        """SQL that holds for a run (alias r) of this cohort that must still be kept, and its parameters."""
        if self.workflows is not None:
            return "(r.workflow = ANY(%s) AND r.finished_at >= %s)", [self.workflows, now - self.retention]
        return "(NOT r.workflow = ANY(%s) AND r.finished_at >= %s)", [self.others, now - self.retention]


def default_retention() -> dt.timedelta:
    return dt.timedelta(seconds=clock.seconds(conf.get("RETENTION"), "DURABLE_RETENTION", zero=False))


def cohorts(older_than: dt.timedelta | None = None) -> list[Cohort]:
    """The groups of runs with one retention each: `older_than` for all, or each workflow's own."""
    if older_than is not None:
        return [Cohort(older_than)]
    own: dict[dt.timedelta, list[str]] = {}
    for definition in registry.definitions():
        if definition.retention is not None:
            own.setdefault(definition.retention, []).append(definition.name)
    return [*(Cohort(kept, sorted(names)) for kept, names in own.items()),
            Cohort(default_retention(), None, sorted(name for names in own.values() for name in names))]


def grace(older_than: dt.timedelta | None = None) -> dt.timedelta | None:
    """How much longer than its retention a run in a time partition waits for its partition's
    drop before it is deleted alone: one interval, where runs are partitioned and no explicit
    age was asked for; else None (deleted as soon as it is past its retention)."""
    shape = partitioning.runs.layout()
    if shape is None or older_than is not None:
        return None
    return partitioning.tables.longest(shape.interval)


def delete_batch(cohort: Cohort, batch: int, grace: dt.timedelta | None = None) -> int:
    """Delete up to `batch` of the cohort's oldest runs (one transaction); return how many."""
    from .models import WorkflowRun

    ids = list(cohort.runs(clock.database_now(conf.get("DATABASE")), grace).order_by("finished_at")
               .values_list("pk", flat=True)[:max(1, batch)])
    if not ids:
        return 0
    stored = payloads.stored_of(ids)
    # Still finished: a run retried meanwhile is left alone.
    _, by_model = partitioning.delete_runs(WorkflowRun.objects.filter(pk__in=ids, status__in=WorkflowRun.TERMINAL),
                                           conf.get("DATABASE"))
    if stored:
        kept = set(WorkflowRun.objects.filter(pk__in=ids).values_list("pk", flat=True))
        payloads.delete([name for run_id, name in stored if run_id not in kept])
    return by_model.get(WorkflowRun._meta.label, 0)


# -- partitions of runs ---------------------------------------------------------------------------


def expired_partitions(older_than: dt.timedelta | None = None, now: dt.datetime | None = None) -> list[str]:
    """The names of the runs table's past partitions whose runs are all finished and past their
    retention (`older_than` for all, or each workflow's own), oldest first. The partition of the
    runs from before the conversion is never one: it is also where an id without a time goes."""
    db = conf.get("DATABASE")
    if partitioning.runs.layout(db) is None:
        return []
    now = now or clock.database_now(db)
    conditions, params = [], []
    for cohort in cohorts(older_than):
        sql, values = cohort.kept_sql(now)
        conditions.append(sql)
        params.extend(values)
    kept = "(" + " OR ".join(conditions) + ")"
    return [partition.name for partition in partitioning.runs.partitions(db)
            if partition.start is not None and partition.end <= now
            and partitioning.runs.expired(partition, kept, params, db)]


def drop_partition(name: str, batch: int = 5000) -> int:
    """Delete what hangs off the runs of partition `name` (in batches of `batch` runs, a short
    transaction each, their stored payloads' files too), then drop it; return how many runs went.
    Safe to run again after a stop anywhere."""
    found = [p for p in partitioning.runs.partitions() if p.name == name]
    if not found:
        return 0  # dropped already
    partition, after, runs = found[0], None, 0
    while ids := partitioning.runs.run_ids(partition, after, batch):
        payloads.delete_files(partitioning.runs.delete_dependents(ids))
        runs, after = runs + len(ids), ids[-1]
    partitioning.runs.drop(partition)
    return runs


def delete_events(batch: int) -> int:
    """Delete the emitted events kept longer than DURABLE_EVENT_RETENTION, in batches."""
    from .models import StoredEvent

    kept = dt.timedelta(seconds=clock.seconds(conf.get("EVENT_RETENTION"), "DURABLE_EVENT_RETENTION"))
    old = StoredEvent.objects.filter(created_at__lt=clock.database_now(conf.get("DATABASE")) - kept)
    gone = 0
    while ids := list(old.order_by("id").values_list("pk", flat=True)[:max(1, batch)]):
        gone += StoredEvent.objects.filter(pk__in=ids).delete()[1].get(StoredEvent._meta.label, 0)
    return gone


def delete_orphaned_payloads() -> int:
    """Delete the stored payloads whose run is gone otherwise than by the prune (the admin's delete,
    a rolled-back start), a day after they were stored; return how many."""
    from django.db.models import Exists, OuterRef

    from .models import StoredPayload, WorkflowRun

    old = clock.database_now(conf.get("DATABASE")) - dt.timedelta(days=1)
    names = list(StoredPayload.objects.filter(created_at__lt=old).exclude(
        Exists(WorkflowRun.objects.filter(pk=OuterRef("run_id")))).values_list("name", flat=True)[:10_000])
    return payloads.delete(names)


def delete_idle_gates() -> int:
    """Delete the debounce and throttle rows of keys unused for DURABLE_RETENTION, and the turn rows
    of fair queues' keys that gave no turn for as long; return how many. (A key whose row is gone
    starts again at its queue's head, as a key that fell behind does: workpool/fairness.py.)"""
    from .models import FairTurn, StartGate

    idle = clock.database_now(conf.get("DATABASE")) - default_retention()
    return (StartGate.objects.filter(updated_at__lt=idle).delete()[1].get(StartGate._meta.label, 0)
            + FairTurn.objects.filter(turn__lt=idle).delete()[1].get(FairTurn._meta.label, 0))


def count(older_than: dt.timedelta | None = None) -> int:
    """How many finished runs prune(older_than) would delete."""
    now = clock.database_now(conf.get("DATABASE"))
    expired = set(expired_partitions(older_than, now))
    dropped = sum(p.rows for p in partitioning.runs.partitions() if p.name in expired)
    return dropped + sum(cohort.runs(now, grace(older_than)).count() for cohort in cohorts(older_than))


def prune(older_than: dt.timedelta | None = None, batch: int = 1000) -> tuple[int, int]:
    """Delete every finished run past its retention and every old event now; (runs, events)."""
    runs = sum(drop_partition(name) for name in expired_partitions(older_than))
    for cohort in cohorts(older_than):
        while (deleted := delete_batch(cohort, batch, grace(older_than))) > 0:
            runs += deleted
    events = delete_events(batch)
    delete_orphaned_payloads()
    partitioning.maintain()
    delete_idle_gates()
    return runs, events


def prune_workflow(ctx, batch: int = 1000) -> dict:
    """The built-in workflow: prune() with each batch a step, so that a worker stopped halfway
    goes on where it was, and the run's page shows how far it got. The cohorts are a step of their
    own: a deploy that changes a retention meanwhile does not change this run's plan."""
    plan = ctx.step("plan", _plan)
    runs = 0
    for name in ctx.step("expired partitions", expired_partitions):
        runs += ctx.step(f"drop {name}", drop_partition, name)
    for index, cohort in enumerate(plan):
        for n in itertools.count(1):
            deleted = ctx.step(f"runs {index + 1}.{n}", _delete_planned, cohort, batch)
            runs += deleted
            if deleted < batch:
                break
    events = ctx.step("events", delete_events, batch)
    ctx.step("orphaned payloads", delete_orphaned_payloads)
    ctx.step("partitions", partitioning.maintain)
    ctx.step("idle gates", delete_idle_gates)
    return {"runs": runs, "events": events}


def _plan() -> list[dict]:
    return [{"seconds": c.retention.total_seconds(), "workflows": c.workflows, "others": c.others} for c in cohorts()]


def _delete_planned(cohort: dict, batch: int) -> int:
    return delete_batch(Cohort(dt.timedelta(seconds=cohort["seconds"]), cohort["workflows"], cohort["others"]),
                        batch, grace())


def register_prune() -> None:
    """Register durable.prune, with its schedule unless DURABLE_PRUNE_SCHEDULE is None."""
    registry.register(registry.WorkflowDefinition(
        name=PRUNE_WORKFLOW, fn=prune_workflow, queue="default", schedule=conf.get("PRUNE_SCHEDULE")))
