"""Creating runs: the one place a run and its work item (and its timers) are stored.

It sits below both the engine (children, replay) and the services (start(), the admin, the API,
the CLI, schedules), so neither calls up into the other to create a run.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import DateTimeField, ExpressionWrapper, Value

from .. import clock, conf, serialization
from ..models import Timer, WorkflowRun, WorkItem
from . import notify


def create_run(definition, args: list, kwargs: dict, *, idempotency_key=None, queue=None, priority=None,
               run_id=None, parent_id=None, run_at=None, detached=False) -> WorkflowRun:
    """Validate and store a run of `definition` with its work item (and deadline); return it.

    A run with a given `run_id` that exists already is returned as it is: a child's id is
    derived from its parent, so starting it again changes nothing. A run with `run_at` waits
    for a timer to start it.
    """
    definition.check_arguments(args, kwargs)
    text = serialization.encode(
        {"args": list(args), "kwargs": kwargs}, what="input", max_bytes=conf.get("MAX_PAYLOAD_BYTES")
    )
    queue_name = _check_queue(queue or definition.queue)
    priority = definition.priority if priority is None else _check_priority(priority)
    if idempotency_key is not None and (not isinstance(idempotency_key, str) or not 0 < len(idempotency_key) <= 255):
        raise ValueError(f"idempotency_key must be a string of 1 to 255 characters, not {idempotency_key!r}.")
    db = conf.get("DATABASE")
    run = WorkflowRun(
        workflow=definition.name,
        input=text,
        queue=queue_name,
        priority=priority,
        idempotency_key=idempotency_key,
        max_attempts=definition.max_attempts,
        parent_id=parent_id,
        detached=detached,
        scheduled_at=run_at,
        waiting_on=f"starts at {run_at:%Y-%m-%d %H:%M:%S %Z}" if run_at is not None else "",
    )
    if run_id is not None:
        run.id = run_id
    with transaction.atomic(using=db):
        if idempotency_key is None and run_id is None:
            run.save(force_insert=True, using=db)
        else:
            # ON CONFLICT DO NOTHING: of two concurrent starts with one key (or id), the second
            # waits for the first to commit and then inserts nothing; both read back one row.
            WorkflowRun.objects.using(db).bulk_create([run], ignore_conflicts=True)
            if run_id is not None:
                existing = WorkflowRun.objects.using(db).get(pk=run_id)
                if WorkItem.objects.using(db).filter(run_id=run_id, kind=WorkItem.Kind.ADVANCE).exists():
                    return existing  # created before, with its work item, in one transaction
            else:
                existing = WorkflowRun.objects.using(db).get(workflow=definition.name, idempotency_key=idempotency_key)
                if existing.pk != run.pk:
                    existing.created_now = False  # the first start's run (the API answers 200, not 201)
                    return existing
            run = existing
        WorkItem.objects.using(db).create(
            kind=WorkItem.Kind.ADVANCE, run=run, queue=queue_name, priority=priority, available_at=clock.db_now(),
            # A delayed run's item stays idle until its timer wakes it.
            status=WorkItem.Status.PENDING if run_at is None else WorkItem.Status.COMPLETED,
        )
        if run_at is not None:
            Timer.objects.using(db).create(kind=Timer.Kind.DELAYED_START, run=run, fire_at=run_at)
        if definition.timeout is not None:
            set_deadline(run, definition.timeout, db, run_at)
        notify(db)
    return run


def set_deadline(run: WorkflowRun, timeout, db: str, run_at=None) -> None:
    """The run ends timed_out at its start (creation, or run_at) + timeout; a timer wakes it then."""
    if run_at is not None:
        deadline = run_at + timeout
    else:
        deadline = ExpressionWrapper(clock.db_now() + Value(timeout), output_field=DateTimeField())
    WorkflowRun.objects.using(db).filter(pk=run.pk).update(deadline_at=deadline)
    run.refresh_from_db(fields=["deadline_at"])
    Timer.objects.using(db).create(kind=Timer.Kind.DEADLINE, run=run, fire_at=run.deadline_at)


def _check_queue(name: Any) -> str:
    if not isinstance(name, str) or not 0 < len(name) <= 100:
        raise ValueError(f"A queue name must be a string of 1 to 100 characters, not {name!r}.")
    return name


def _check_priority(priority: Any) -> int:
    if type(priority) is not int or not -(2**31) <= priority < 2**31:
        raise ValueError(f"priority must be an integer (higher runs first), not {priority!r}.")
    return priority
