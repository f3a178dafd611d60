"""Creating runs: the one place a run and its work item (and its timers) are stored.

Two ways in, one for each shape of start: create_run() for one run of any kind (an idempotency
key read back, a delay, a deadline, a parent, a subject), and insert_ready() for runs ready now
(start() of the commonest kind, start_many(), a schedule's fire times), one statement on
PostgreSQL (queries.START) and its ORM twin elsewhere. It sits below both the engine (children,
replay) and the services (start(), the admin, the API, the CLI, schedules), so neither calls up
into the other to create a run.
"""

from __future__ import annotations

import datetime as dt
import json
import time
import uuid
from typing import Any, NamedTuple

from django.db import IntegrityError, connections, transaction
from django.db.models import DateTimeField, ExpressionWrapper, Value

from .. import clock, conf, partitioning, queues, serialization, telemetry
from ..databases import refuse_other_transaction
from ..exceptions import SubjectBusy
from ..models import Timer, WorkflowRun, WorkItem, uuid7
from ..models.base import unsaved
from . import fairness, postgres, queries, statements
from .wakeups import notify


def create_run(definition, args: list, kwargs: dict, *, idempotency_key=None, queue=None, priority=None,
               run_id=None, parent_id=None, run_at=None, detached=False, concurrency_key=None,
               subject=None, lock: str | None = None) -> WorkflowRun:
    """Validate and store a run of `definition` with its work item (and deadline); return it.

    A run with a given `run_id` that exists already is returned as it is: a child's id is
    derived from its parent, so starting it again changes nothing. A run with `run_at` waits
    for a timer to start it; one whose `run_at` has passed is ready at once, in its place among
    the ready runs of its priority (ordered by when each became ready: its `run_at`). `subject` (a saved model instance) is what the run is about.
    `lock` (start(..., singleton=key): "singleton:<key>") makes it the only unfinished run of the
    workflow with that lock: a second raises SubjectBusy, as one_at_a_time's subject lock does.
    """
    pk = run_id if run_id is not None else uuid7()
    text = stored_input(definition, args, kwargs, pk)
    queue_name = _check_queue(queue or definition.queue)
    priority = definition.priority if priority is None else _check_priority(priority)
    if idempotency_key is not None and (not isinstance(idempotency_key, str) or not 0 < len(idempotency_key) <= 255):
        raise ValueError(f"idempotency_key must be a string of 1 to 255 characters, not {idempotency_key!r}.")
    concurrency_key = _check_concurrency_key(concurrency_key)
    db = conf.get("DATABASE")
    refuse_other_transaction(db, f"A run of {definition.name!r} was started")
    due = run_at is not None and run_at <= clock.now()
    run = unsaved(
        WorkflowRun,
        id=pk,
        workflow=definition.name,
        input=text,
        queue=queue_name,
        priority=priority,
        concurrency_key=concurrency_key,
        idempotency_key=idempotency_key,
        max_attempts=definition.max_attempts,
        parent_id=parent_id,
        detached=detached,
        scheduled_at=run_at,
        waiting_on=f"starts at {run_at:%Y-%m-%d %H:%M:%S %Z}" if run_at is not None and not due else "",
        **_subject_fields(definition, subject, lock),
    )
    if run_id is None and idempotency_key is None and run_at is None and parent_id is None \
            and definition.timeout is None and subject is None and lock is None and conf.is_postgres(db):
        return _insert_at_once(run, db)
    with transaction.atomic(using=db):
        if idempotency_key is None and run_id is None:
            try:
                with transaction.atomic(using=db):
                    run.save(force_insert=True, using=db)
            except IntegrityError:
                if run.subject_lock is None:
                    raise
                raise _busy(definition, run, db) from None
        else:
            # ON CONFLICT DO NOTHING: of two concurrent starts with one key (or id), the second
            # waits for the first to commit and then inserts nothing; both read back one row.
            if run.subject_lock is None:
                WorkflowRun.objects.using(db).bulk_create([run], ignore_conflicts=True)
            else:
                try:
                    with transaction.atomic(using=db):
                        WorkflowRun.objects.using(db).bulk_create([run], ignore_conflicts=True)
                except IntegrityError:
                    # Partitioned runs keep one_at_a_time in a side table, whose trigger refuses
                    # the insert (partitioning/runs.py); a plain table's index made it insert nothing.
                    raise _busy(definition, run, db) from None
            if run_id is not None:
                existing = WorkflowRun.objects.using(db).get(pk=run_id)
                if existing.status in WorkflowRun.TERMINAL or \
                        WorkItem.objects.using(db).filter(run_id=run_id, kind=WorkItem.Kind.ADVANCE).exists():
                    # Created before, with its work item, in one transaction (an ended run's is gone).
                    return existing
            else:
                existing = WorkflowRun.objects.using(db).filter(
                    workflow=definition.name, idempotency_key=idempotency_key).first()
                if existing is None:  # the insert met another unique rule: one_at_a_time
                    raise _busy(definition, run, db)
                if existing.pk != run.pk:
                    existing.created_now = False  # the first start's run (the API answers 200, not 201)
                    return existing
            run = existing
        # A delayed run's item stays idle until its timer wakes it (fire_timers: ready as of run_at).
        ready = run_at is None or due
        turn = fairness.turns(db, run.queue, run.concurrency_key) if ready else None  # None: not a fair queue
        advance_item(run, ready=ready, available_at=run_at, turn=turn and turn[0]).save(using=db, force_insert=True)
        if run_at is not None and not due:
            Timer.objects.using(db).create(kind=Timer.Kind.DELAYED_START, run=run, fire_at=run_at)
        if definition.timeout is not None:
            set_deadline(run, definition.timeout, db, run_at)
        notify(db)
    return run


def stored_input(definition, args, kwargs: dict, run_id, *, validated: bool = False, carried=None) -> str:
    """The input column of run `run_id` of `definition` for these arguments: validated (the
    workflow's `input`; not again if `validated`), with the caller's trace (`carried`, else read
    now), within DURABLE_MAX_PAYLOAD_BYTES, a large one stored apart as the run's. The one
    encoding of a run's input: start(), start_many(), a schedule's fire time, a gated start."""
    if not validated:
        args, kwargs = definition.validated(args, kwargs)
    return serialization.encode({"args": list(args), "kwargs": kwargs, **(telemetry.carried() if carried is None
                                                                           else carried)},
                                what="input", max_bytes=conf.get("MAX_PAYLOAD_BYTES"), owner=run_id)


def advance_item(run, *, ready: bool = True, available_at=None, turn=None) -> WorkItem:
    """The work item that advances `run` (a WorkflowRun or a NewRun), unsaved: ready now (or as
    of `available_at`, or at its `turn` in a fair queue: fairness.turns), or idle (``completed``)
    until a wakeup makes it ready. A run has exactly one until it ends; its end deletes it
    (endings.py), and a retry of the ended run makes it again (pending.back_to_pending)."""
    return WorkItem(kind=WorkItem.Kind.ADVANCE, run_id=run.id, queue=run.queue, priority=run.priority,
                    concurrency_key=run.concurrency_key or "", turn=turn,
                    available_at=turn or available_at or clock.db_now(),
                    status=WorkItem.Status.PENDING if ready else WorkItem.Status.COMPLETED)


def subject_key(subject, what: str = "subject"):
    """(content type, primary key as text) of `subject`, a saved model instance; ValueError otherwise."""
    if getattr(subject, "_meta", None) is None or getattr(subject, "pk", None) is None:
        raise ValueError(f"{what} must be a saved model instance, not {subject!r}.")
    from django.contrib.contenttypes.models import ContentType

    return ContentType.objects.get_for_model(subject), str(subject.pk)


def _subject_fields(definition, subject, lock: str | None = None) -> dict:
    """The run's subject columns for `subject` (a saved model instance, or None), and its lock:
    `lock` if given (a singleton's), else the subject's for a one_at_a_time workflow."""
    fields = {} if lock is None else {"subject_lock": lock}
    if subject is None:
        return fields
    content_type, pk = subject_key(subject)
    return {
        # The id, not the instance: the content type may be on another database (no relation there).
        "subject_type_id": content_type.pk, "subject_id": pk, "subject_label": str(subject)[:200],
        "subject_lock": f"{content_type.pk}:{pk}" if definition.one_at_a_time else None, **fields,
    }


def _busy(definition, run: WorkflowRun, db: str) -> SubjectBusy:
    holder = WorkflowRun.objects.using(db).filter(workflow=definition.name, subject_lock=run.subject_lock) \
        .exclude(status__in=WorkflowRun.TERMINAL).values_list("pk", flat=True).first()
    return SubjectBusy(
        f"Workflow {definition.name!r} runs one at a time per subject, and {run.subject_label or run.subject_id} "
        f"already has an unfinished run{f' ({holder})' if holder else ''}.", run_id=holder)


def _insert_at_once(run: WorkflowRun, db: str) -> WorkflowRun:
    """The commonest start, a run ready now, in one statement on PostgreSQL (queries.START_ONE; in
    a fair queue its turn taken in the same statement, queries.FAIR_TURN)."""
    run.id_time = partitioning.runs.key(run.id, db)
    params = [run.id, run.workflow, run.input, run.max_attempts, run.queue, run.priority, run.concurrency_key]
    if partitioning.runs.layout(db) is not None:
        params.append(run.id_time)
    weight = fairness.weight(run.queue, run.concurrency_key)
    if weight is not None:
        params = [run.queue, run.concurrency_key, 1, weight, run.queue, *params]
    # Only a start that is its own transaction reads or leaves the window: what one inside a
    # transaction sees may be its transaction's own items, and its commit may come much later.
    key = None if connections[db].in_atomic_block else (db, run.queue)
    seen = _ready_seen.get(key) if key is not None else None
    quiet = seen is not None and time.monotonic() - seen < READY_SEEN_SECONDS
    row = _insert(db, queries.START_ONE, params, notify="" if quiet else queries.START_NOTIFY_IF_IDLE,
                  turns=None if weight is None else "one")
    run.created_at = row[1]
    if key is not None and not quiet and len(row) > 2 and row[2]:  # it saw a ready item waiting
        _ready_seen[key] = time.monotonic()
    run.updated_at = run.created_at
    run._state.adding, run._state.db = False, db
    return run


# Seconds after a start in this process saw a ready item waiting in its queue (so its workers
# busy, or told) during which the queue's next starts here (each its own transaction, as that
# one was) neither look again nor NOTIFY. A look is an index probe and a heap read on the server
# (34 µs of a 0.74 ms start, measured interleaved). The worker that takes the waiting item goes
# idle after it and looks once more SETTLE_SECONDS (50 ms) later: a start that committed within
# this window (and its own commit's time) of the look is seen then, as a start that saw the item
# itself would be.
READY_SEEN_SECONDS = 0.02

# When a start last saw a ready item waiting, by (database alias, queue): time.monotonic().
_ready_seen: dict[tuple[str, str], float] = {}


def _insert(db: str, runs: str, params: list, *, notify: str, id_time_value: str | None = None,
            skip_existing: bool = False, turns: str | None = None) -> tuple:
    """queries.START with `runs` as its rows and `notify` (a START_NOTIFY, or "") as its wake-up;
    its row: how many runs, the last one's created_at, and with START_NOTIFY_IF_IDLE whether a
    ready item was waiting. `turns`: "one", the run's turn in a fair
    queue taken by the statement (FAIR_TURN's parameters first), or "many", the runs' turns taken
    before (two arrays last: run ids and their turns); None, every run ready now."""
    parts = postgres.run_parts()
    now = clock.now_sql("postgresql")
    key = (runs, notify if conf.get("LISTEN_NOTIFY") else "", parts["id_time_column"], id_time_value, skip_existing,
           now, turns)
    sql = _start_sql.get(key)
    if sql is None:  # assembled once per shape, not at every start
        if id_time_value is not None and parts["id_time_value"]:
            parts = {**parts, "id_time_value": id_time_value}
        item = {"one": queries.START_TURN, "many": queries.START_TURNS}.get(turns, queries.START_FIRST_COME)
        sql = queries.START.format(runs=runs.format(**parts), now=now, notify=key[1].format(now=now),
                                   conflict="\n    ON CONFLICT DO NOTHING" if skip_existing else "",
                                   turn=queries.FAIR_TURN.format(now=now) + ",\n" if turns == "one" else "",
                                   **{name: text.format(now=now) for name, text in item.items()}, **parts)
        if len(_start_sql) > 64:
            _start_sql.clear()
        _start_sql[key] = sql
    return statements.execute(db, sql, params)[0]


# queries.START filled in, by its parts (runs._insert's key): the same few shapes at every start.
_start_sql: dict = {}


class NewRun(NamedTuple):
    """A run to insert ready now (insert_ready): its input is encoded JSON text already."""

    id: uuid.UUID
    workflow: str
    input: str
    max_attempts: int
    queue: str
    priority: int
    concurrency_key: str = ""
    idempotency_key: str | None = None
    scheduled_at: dt.datetime | None = None  # a schedule's fire time


# The columns queries.START_MANY takes as arrays, in its order (the inputs follow, as one JSON array).
_START_MANY_ARRAYS = ("id", "workflow", "max_attempts", "queue", "priority", "concurrency_key", "idempotency_key",
                      "scheduled_at")


def insert_ready(runs: list[NewRun], db: str, *, skip_existing: bool = False, notify: bool = True) -> None:
    """Store `runs`, ready now, with their advance items: one statement per START_MANY_BATCH on
    PostgreSQL (queries.START with START_MANY), two bulk inserts elsewhere.

    With `skip_existing`, a run whose id or idempotency key is taken already is left out (with its
    item): another worker started that schedule's fire time first. Inside the caller's
    transaction.atomic() they commit with it.
    """
    for first in range(0, len(runs), START_MANY_BATCH):
        batch = runs[first:first + START_MANY_BATCH]
        taken = _turns(db, batch)  # {run id: its turn} of the runs in fair queues
        if conf.is_postgres(db):
            arrays = [statements.Binary([getattr(run, name) for run in batch]) for name in _START_MANY_ARRAYS]
            inputs = json.dumps([run.input for run in batch])
            turns = [statements.Binary(taken), statements.Binary(taken.values())] if taken else []
            _insert(db, queries.START_MANY, [*arrays, inputs, *turns],
                    skip_existing=skip_existing, turns="many" if taken else None,
                    notify=queries.START_NOTIFY if notify and first + START_MANY_BATCH >= len(runs) else "",
                    id_time_value=", durable_run_id_time(given.id)")
        else:
            WorkflowRun.objects.using(db).bulk_create(
                [WorkflowRun(**new._asdict()) for new in batch], ignore_conflicts=skip_existing)
            # An item's run id is unique among advance items: a run left out keeps the item it has.
            WorkItem.objects.using(db).bulk_create([advance_item(new, turn=taken.get(new.id)) for new in batch],
                                                   ignore_conflicts=skip_existing)


def _turns(db: str, runs: list[NewRun]) -> dict:
    """{run id: its turn} of the runs in fair queues (fairness.turns), taken for each key at once."""
    keys: dict[tuple[str, str], list] = {}
    for run in runs:
        if queues.fair(run.queue) is not None:
            keys.setdefault((run.queue, run.concurrency_key or ""), []).append(run.id)
    return {run_id: turn for (queue, key), ids in keys.items()
            for run_id, turn in zip(ids, fairness.turns(db, queue, key, len(ids)))}


def start_many(definition, calls, *, queue=None, priority=None, concurrency_key=None) -> list:
    """Store a run of `definition` for each of `calls` (a dict of keyword arguments, or a list or
    tuple of positional ones), ready now, in one statement per 5,000 runs; return their ids.

    Every call's arguments are checked and encoded first: one that is refused (named by its
    index, `calls[2]`) stores nothing. Inside the caller's transaction.atomic() they commit with it.
    """
    # Every call checked first, then encoded: a refused one stores nothing, not even a large input
    # of an earlier call stored apart.
    checked = []
    for position, call in enumerate(calls):
        if isinstance(call, dict):
            args, kwargs = [], call
        elif isinstance(call, (list, tuple)):
            args, kwargs = list(call), {}
        else:
            raise TypeError(f"start_many() takes, for each run, a dict of keyword arguments or a list of "
                            f"positional ones; calls[{position}] is a {type(call).__name__}.")
        try:
            checked.append(definition.validated(args, kwargs))
        except (TypeError, ValueError) as exc:
            exc.args = (f"start_many() calls[{position}]: {exc}", *exc.args[1:])
            raise
    carried = telemetry.carried()
    ids = [uuid7() for _ in checked]
    inputs = []
    for position, ((args, kwargs), run_id) in enumerate(zip(checked, ids)):
        try:
            inputs.append(stored_input(definition, args, kwargs, run_id, validated=True, carried=carried))
        except (TypeError, ValueError) as exc:
            exc.args = (f"start_many() calls[{position}]: {exc}", *exc.args[1:])
            raise
    queue_name = _check_queue(queue or definition.queue)
    priority = definition.priority if priority is None else _check_priority(priority)
    concurrency_key = _check_concurrency_key(concurrency_key)
    runs = [NewRun(run_id, definition.name, text, definition.max_attempts, queue_name, priority, concurrency_key)
            for run_id, text in zip(ids, inputs)]
    db = conf.get("DATABASE")
    refuse_other_transaction(db, f"Runs of {definition.name!r} were started")
    with transaction.atomic(using=db):
        insert_ready(runs, db)
    return [run.id for run in runs]


START_MANY_BATCH = 5000


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


def _check_concurrency_key(key: Any) -> str:
    if key is None:
        return ""
    if not isinstance(key, str) or not 0 < len(key) <= 200:
        raise ValueError(f"concurrency_key must be a string of 1 to 200 characters, not {key!r}.")
    return key


def _check_priority(priority: Any) -> int:
    if type(priority) is not int or not -(2**31) <= priority < 2**31:
        raise ValueError(f"priority must be an integer (higher runs first), not {priority!r}.")
    return priority
