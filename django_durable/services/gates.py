"""Starts gated by a key: start(..., singleton=key), debounce=(key, period), throttle=(key, limit, period).

- **singleton**: at most one unfinished run of the workflow per key. The run carries the lock
  "singleton:<key>" in the column one_at_a_time uses (a unique index among unfinished runs, or on
  partitioned runs the side table's trigger), so the database decides between concurrent starts; the
  second gets the first's run back, or SingletonBusy where the workflow says singleton_busy="refuse".
- **debounce**: the run starts once the key has been quiet for the period, with the last call's
  input. The first call stores a run delayed by the period; each call before it starts moves its
  delayed start to now + period and replaces its input, and returns that run.
- **throttle**: at most `limit` runs of the key become ready in any window of `period`: a start
  beyond that is delayed to the earliest time that keeps the rule (never dropped).

Debounce and throttle keep a row per (workflow, kind, key), durable_start_gate, locked for the
start's transaction: concurrent starts with one key take turns on it, on PostgreSQL as on SQLite.
"""

from __future__ import annotations

import datetime as dt

from django.db import IntegrityError, transaction
from django.utils.dateparse import parse_datetime

from .. import clock, conf
from ..exceptions import SingletonBusy, SubjectBusy
from ..models import StartGate, Timer, WorkflowRun, WorkItem
from ..workpool.runs import create_run, stored_input

KEY_LENGTH = 200


def options(singleton=None, debounce=None, throttle=None) -> tuple | None:
    """The gate a start asked for, checked: ("singleton", key), ("debounce", key, seconds) or
    ("throttle", key, limit, seconds); None for none. ValueError for a bad one, or more than one."""
    given = [name for name, value in (("singleton", singleton), ("debounce", debounce), ("throttle", throttle))
             if value is not None]
    if not given:
        return None
    if len(given) > 1:
        raise ValueError(f"Give one of singleton, debounce and throttle, not {' and '.join(given)}.")
    if singleton is not None:
        return ("singleton", _key(singleton, "singleton"))
    if debounce is not None:
        if not isinstance(debounce, (tuple, list)) or len(debounce) != 2:
            raise ValueError(f"debounce is (key, period), not {debounce!r}.")
        return ("debounce", _key(debounce[0], "debounce's key"), _period(debounce[1], "debounce's period"))
    if not isinstance(throttle, (tuple, list)) or len(throttle) != 3:
        raise ValueError(f"throttle is (key, limit, period), not {throttle!r}.")
    key, limit, period = throttle
    if type(limit) is not int or limit < 1:
        raise ValueError(f"throttle's limit is a number of starts, 1 or more, not {limit!r}.")
    return ("throttle", _key(key, "throttle's key"), limit, _period(period, "throttle's period"))


def start(definition, args: list, kwargs: dict, gate: tuple, *, run_at=None, idempotency_key=None, subject=None,
          **create) -> WorkflowRun:
    """A run of `definition` started through `gate` (options()); `create` goes to create_run."""
    kind = gate[0]
    if idempotency_key is not None:
        raise ValueError(f"{kind} decides which start makes a run: give it or an idempotency_key, not both.")
    if kind in ("debounce", "throttle") and run_at is not None:
        raise ValueError(f"{kind} decides when the run starts: give it or run_at/delay, not both.")
    if kind == "singleton":
        if subject is not None and definition.one_at_a_time:
            raise ValueError(f"Workflow {definition.name!r} is one_at_a_time per subject: give it a subject or a "
                             f"singleton key, not both.")
        return _singleton(definition, args, kwargs, gate[1], run_at=run_at, subject=subject, **create)
    if kind == "debounce":
        return _debounced(definition, args, kwargs, gate[1], gate[2], subject=subject, **create)
    return _throttled(definition, args, kwargs, gate[1], gate[2], gate[3], subject=subject, **create)


def _singleton(definition, args, kwargs, key: str, **create) -> WorkflowRun:
    db = conf.get("DATABASE")
    lock = f"singleton:{key}"
    for _ in range(5):  # the holder may finish between our refused insert and our read of it
        try:
            return create_run(definition, args, kwargs, lock=lock, **create)
        except SubjectBusy:
            holder = (WorkflowRun.objects.using(db).filter(workflow=definition.name, subject_lock=lock)
                      .exclude(status__in=WorkflowRun.TERMINAL).first())
        if holder is None:
            continue
        if definition.singleton_busy == "refuse":
            raise SingletonBusy(f"Workflow {definition.name!r} has an unfinished run with the singleton key {key!r} "
                                f"({holder.pk}).", run_id=holder.pk)
        holder.created_now = False  # the API answers 200 with it, not 201
        return holder
    raise SingletonBusy(f"Workflow {definition.name!r}: the runs with the singleton key {key!r} kept finishing and "
                        f"starting while this start tried; try again.")


def _debounced(definition, args, kwargs, key: str, seconds: float, **create) -> WorkflowRun:
    db = conf.get("DATABASE")
    with transaction.atomic(using=db):
        gate = _gate(definition.name, StartGate.Kind.DEBOUNCE, key, db)
        due = clock.database_now(db) + dt.timedelta(seconds=seconds)
        held = _held(gate, db)
        if held is None:
            run = create_run(definition, args, kwargs, run_at=due, **create)
            gate.run_id = run.pk
            gate.save(update_fields=["run_id", "updated_at"])
            return run
        # Still waiting for quiet: the last call's input, and quiet counted from now.
        WorkflowRun.objects.using(db).filter(pk=held.run_id).update(
            input=stored_input(definition, list(args), kwargs, held.run_id), scheduled_at=due, waiting_on=f"starts at {due:%Y-%m-%d %H:%M:%S %Z}")
        Timer.objects.using(db).filter(pk=held.pk).update(fire_at=due)
        WorkItem.objects.using(db).filter(run_id=held.run_id, kind=WorkItem.Kind.ADVANCE).update(available_at=due)
        gate.save(update_fields=["updated_at"])
    run = WorkflowRun.objects.using(db).get(pk=held.run_id)
    run.created_now = False
    return run


def _held(gate: StartGate, db: str) -> Timer | None:
    """The delayed start of the run `gate` holds back, locked, while it has not fired."""
    if gate.run_id is None:
        return None
    return (Timer.objects.using(db).select_for_update()
            .filter(run_id=gate.run_id, kind=Timer.Kind.DELAYED_START, status=Timer.Status.PENDING).first())


def _throttled(definition, args, kwargs, key: str, limit: int, seconds: float, **create) -> WorkflowRun:
    db = conf.get("DATABASE")
    period = dt.timedelta(seconds=seconds)
    with transaction.atomic(using=db):
        gate = _gate(definition.name, StartGate.Kind.THROTTLE, key, db)
        now = clock.database_now(db)
        given = [moment for moment in map(parse_datetime, gate.starts) if moment is not None][-limit:]
        at = now if len(given) < limit else max(now, given[-limit] + period)
        run = create_run(definition, args, kwargs, run_at=at if at > now else None, **create)
        gate.starts = [moment.isoformat() for moment in [*given, at][-limit:]]
        gate.save(update_fields=["starts", "updated_at"])
    return run


def _gate(workflow: str, kind: str, key: str, db: str) -> StartGate:
    """The gate's row, made if missing, locked until the transaction ends."""
    gates = StartGate.objects.using(db)
    try:
        with transaction.atomic(using=db):
            gates.get_or_create(workflow=workflow, kind=kind, key=key)
    except IntegrityError:  # made meanwhile by a concurrent start: it is there now
        pass
    return gates.select_for_update().get(workflow=workflow, kind=kind, key=key)


def _key(value, what: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= KEY_LENGTH:
        raise ValueError(f"{what} is a string of 1 to {KEY_LENGTH} characters, not {value!r}.")
    return value


def _period(value, what: str) -> float:
    seconds = clock.seconds(value, what)
    if seconds <= 0:
        raise ValueError(f"{what} must be more than 0 seconds, not {value!r}.")
    return seconds
