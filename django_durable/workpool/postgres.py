"""The workpool's hot path on PostgreSQL: every operation is one statement, one round trip, one commit.

Each statement runs in autocommit mode, so it is its own short transaction: no row lock outlives
it and no transaction stays open while user code runs. Data-modifying CTEs let one statement
claim a row, mark its run and read the run's journal, or fence, record and finish together.
(Where the runs table is partitioned, a claim is two: the item, then its run given its partition.)
The statements themselves are in queries.py, whole and commented; this module fills them in and
names the rows they answer (rows.py); statements.py sends them (prepared, pipelined).
"""

from __future__ import annotations

import datetime as dt
import operator
import uuid
from typing import TYPE_CHECKING

from django.db import transaction

from .. import clock, partitioning
from .. import queues as durable_queues
from ..journal import STEP_COLUMNS, UPSERT, UPSERT_PARTITIONED
from ..models import WorkflowRun, WorkItem
from ..models.pool import after
from . import queries, statements
from .endings import UNCHANGED
from .rows import Child, ClaimParams, Claimed, ClaimRow, Entry, Message, Place, RunColumns

if TYPE_CHECKING:
    from ..journal import StepRecord
    from .holds import Claim, Ending

# A claim's clock is the database's when its statement began: the lease counts from the moment
# the statement was sent (backend.Backend.CLOCK_AT_SEND).
CLOCK_AT_SEND = True

_TERMINAL = ", ".join(f"'{status}'" for status in sorted(WorkflowRun.TERMINAL))
_ADVANCING = ", ".join(f"'{status}'" for status in WorkflowRun.ADVANCING)

_COLUMN_NAMES = ", ".join(f'"{name}"' for name, _ in STEP_COLUMNS)
_ROW = "(" + ", ".join(f"%s::{sqltype}" for _, sqltype in STEP_COLUMNS) + ")"

_pick_cache: dict = {}
_claim_sql_cache: dict = {}
_run_state_sql: dict = {}  # RUN_STATE filled in, by the journal's layout and the clock

_ENTRY, _MESSAGE, _CHILD = (
    "json_build_array(" + ", ".join(f"{alias}.{name}" for name in row._fields) + ")"
    for alias, row in (("s", Entry), ("m", Message), ("k", Child))
)

def _fill(template: str, **parts) -> str:
    """A template of queries.py with its parts in braces filled in."""
    return template.format(now=clock.now_sql("postgresql"), terminal=_TERMINAL, advancing=_ADVANCING,
                           **_journal_parts(), **run_parts(), **parts)


# The parts that differ where the runs table is partitioned (partitioning/runs.py), by layout.
# Every statement that looks a run up by its id is given the run's partition as a parameter, its
# id_time: PostgreSQL then leaves the other partitions out before it starts the statement, as
# cheap as a plain table. (Named from a run id the statement finds, the others would be left out
# only as it runs, after a scan of each was started: measured, 0.15 ms a lookup at 14 partitions;
# so a claim reads its run in a statement of its own, queries.RUN_STATE.)
_run_parts_of: dict = {
    False: {"fence_partition": "", "given_partition": "", "id_time_column": "", "id_time_value": ""},
    True: {"fence_partition": " AND r.id_time = %s", "given_partition": " AND id_time = %s",
           "id_time_column": ", id_time", "id_time_value": ", %s"},
}


def run_parts() -> dict:
    return _run_parts_of[partitioning.runs.layout() is not None]


def given_run(run_id) -> list:
    """The parameters the parts {given_partition} and {fence_partition} take for run `run_id`:
    its id_time, where the runs table is partitioned; nothing otherwise."""
    return [partitioning.runs.key(run_id)] if partitioning.runs.layout() is not None else []


def _journal_key(run_id) -> list:
    """The parameters the journal's {key_value} and {group_partition} take for run `run_id`."""
    return given_run(run_id) if partitioning.layout() is not None else []


# The parts that differ where the journal is partitioned (partitioning.py), by layout: made once.
_journal_parts_of: dict = {}
_PLAIN_JOURNAL = {"upsert": UPSERT, "key_column": "", "key_value": "", "own_partition": "", "group_partition": ""}


def _journal_parts() -> dict:
    shape = partitioning.layout()
    if shape is None:
        return _PLAIN_JOURNAL
    runs_partitioned = partitioning.runs.layout() is not None
    parts = _journal_parts_of.get((shape, runs_partitioned))
    if parts is None:
        def key_of(run_id: str) -> str:
            named = " AND kr.id_time = %s" if runs_partitioned else ""  # the claim's run (_journal_key)
            return f"(SELECT {shape.key_sql('kr')} FROM durable_workflow_run AS kr WHERE kr.id = {run_id}{named})"

        parts = _journal_parts_of[(shape, runs_partitioned)] = {
            "upsert": UPSERT_PARTITIONED, "key_column": ', "run_created_at"', "key_value": f", {key_of('v.run_id')}",
            "own_partition": f" AND s.run_created_at = {shape.key_sql('r')}",
            "group_partition": f" AND g.run_created_at = {key_of('(SELECT run_id FROM fence)')}"}
    return parts


class _Slot:
    """Stands in a cached pick's parameters for a value each claim gives: the id of the item the
    claim's statement ends, or a part of the claimer's floor."""


_ENDING = _Slot()
_FLOOR = Place(_Slot(), _Slot(), _Slot())  # type: ignore[arg-type]


def _filled(params: list, ending, floor: Place | None) -> list:
    """A cached pick's parameters with its slots filled in."""
    slots = {id(_ENDING): ending, **({id(slot): value for slot, value in zip(_FLOOR, floor)} if floor else {})}
    return [slots.get(id(param), param) if isinstance(param, _Slot) else param for param in params]

# Stands in the compiled probe of one queue for the queue it probes (served.queue).
_SERVED = "\x00served queue"


def _served_probe(sql: str, params: list) -> tuple[str, list]:
    """`sql` with the placeholders of _SERVED made `served.queue`, and the parameters left."""
    parts, kept = sql.split("%s"), []
    text = parts[0]
    for param, part in zip(params, parts[1:]):
        if param == _SERVED:
            text += "served.queue" + part
        else:
            text += "%s" + part
            kept.append(param)
    return text, kept


def _pick(queues, db, avoid=(), limits=(), ending=0, floor: Place | None = None) -> tuple[str, list]:
    """SQL that locks the next ready item, built by the ORM's select_for_update(skip_locked=True).

    SKIP LOCKED: claimers never wait for each other, each takes the next row nobody holds.
    NO KEY UPDATE: the lock does not block inserts that reference the row.
    """
    key = (db, tuple(queues or ()), clock.now_sql("postgresql"), avoid, limits, floor is not None)
    if key not in _pick_cache:
        several = queues is not None and len(queues) > 1
        assert floor is None or not several, "a floor is given to a claim of every queue or of one"
        locked = WorkItem.objects.using(db).ready(None if several else queues, avoid, limits, ending=_ENDING)
        if floor is not None:
            sql, params = _after_floor(locked, db, 1)
        elif several:
            # One probe per queue (queries.PICK_FROM_QUEUES): its first ready item, through the
            # per-queue index. A range, not an equality, and the queue first in the order: no other
            # index gives that order, so the plan takes that index whatever the statistics say (with
            # an equality it walked the all-queues index instead: all of it, for a queue with none ready).
            locked = locked.filter(queue__gte=_SERVED, queue__lte=_SERVED).order_by(
                "queue", "-priority", "available_at", "id")
            sql, params = _served_probe(*_compiled(
                locked.select_for_update(skip_locked=True, no_key=True).values("id", "priority", "available_at")[:1], db))
            sql, params = queries.PICK_FROM_QUEUES.format(probe=sql), [list(queues), *params]
        else:
            sql, params = _compiled(locked.select_for_update(skip_locked=True, no_key=True).values("id")[:1], db)
        if len(_pick_cache) > 64:
            _pick_cache.clear()
        _pick_cache[key] = (sql, params)
    sql, params = _pick_cache[key]
    return sql, _filled(params, ending, floor) if limits or floor is not None else params


def _compiled(queryset, db: str) -> tuple[str, list]:
    """The SQL of a locking `queryset` and its parameters. (The ORM compiles a locking query only
    inside a transaction; compiling sends nothing.)"""
    with transaction.atomic(using=db):
        sql, params = queryset.query.get_compiler(using=db).as_sql()
    return sql, list(params)


def _after_floor(ready, db: str, k: int) -> tuple[str, list]:
    """SQL that locks the first `k` of the `ready` items after the claimer's floor (its slots,
    _FLOOR; claiming.Floors): the first k of a higher priority and the first k of its priority at
    or after it, each a range of the ready index, then the first k of both. All of those are
    locked for the moment of the statement; the claim takes the k."""
    parts, params = [], []
    for part in ("above", "from"):  # (locking selects may not be the arms of a UNION: CTEs may)
        sql, part_params = _compiled(ready.filter(after(_FLOOR, part)).select_for_update(skip_locked=True, no_key=True)
                                     .values("id", "priority", "available_at")[:k], db)
        parts.append(f"floor_{part} AS ({sql})")
        params += part_params
    return (f"WITH {', '.join(parts)} SELECT p.id FROM (SELECT * FROM floor_above UNION ALL SELECT * FROM floor_from) AS p "
            f"ORDER BY p.priority DESC, p.available_at, p.id LIMIT {k}"), params


def _claim_parts(params: ClaimParams, exclude=(), ending=0) -> tuple[str, str, list, list]:
    """queries.CLAIM_CTES and CLAIM_SELECT filled in for `params`, their parameters, and the limited
    queues whose turns the claim takes (_execute_claim); `exclude` are the conditions on the claimed
    item `w` of the items changed by the CTEs this claim follows, and `ending` the item they end
    (which no longer counts against its queue's limits)."""
    limits = tuple(durable_queues.served(params.queues))
    pick_sql, pick_params = _pick(params.queues, params.db, params.avoid, limits, ending, params.floor)
    rates = [limit for limit in limits if limit.rate is not None]
    key = (pick_sql, exclude, bool(rates), partitioning.layout(params.db), partitioning.runs.layout(params.db),
           clock.now_sql("postgresql"))
    if key not in _claim_sql_cache:  # the same few shapes, filled in once each (per layout of the tables)
        chain_guard = " ".join(f"AND NOT COALESCE({condition}, false)" for condition in exclude)
        rated = _fill(queries.CLAIM_RATE) if rates else ""
        if len(_claim_sql_cache) > 64:
            _claim_sql_cache.clear()
        # Where runs are partitioned, the claim takes the item alone; RUN_STATE then reads its run.
        apart = partitioning.runs.layout(params.db) is not None
        claim_run = "" if apart else _fill(queries.CLAIM_RUN)
        select = queries.CLAIM_ITEM_SELECT if apart else queries.CLAIM_SELECT
        _claim_sql_cache[key] = (_fill(queries.CLAIM_CTES, pick=pick_sql, chain_guard=chain_guard, rated=rated,
                                       claim_run=claim_run, snapshot_moved=queries.SNAPSHOT_MOVED),
                                 _fill(select, entry=_ENTRY, message=_MESSAGE, child=_CHILD))
    ctes, select = _claim_sql_cache[key]
    values = [*pick_params, params.token, params.worker, params.lease]
    if rates:
        values += [[limit.name for limit in rates], [limit.interval for limit in rates]]
    return ctes, select, values, [limit.name for limit in limits]


def _execute_claim(db: str, sql: str, params, turns: list[str]):
    """execute() a statement that claims, after taking the `turns` of the limited queues it claims
    from (queries.QUEUE_TURN) in the same transaction, when there are any (_in_transaction)."""
    if not turns:
        return statements.execute(db, sql, params)
    return statements.in_transaction(db, [(queries.QUEUE_TURN, [turns])], sql, params)


def _claimed(row: tuple | None, params: ClaimParams) -> Claimed | None:
    """The claim statement's row, named (None: nothing was ready). Where runs are partitioned, the
    row has the item alone: its run is read by RUN_STATE (None too if the claim is gone already)."""
    if row is None:
        return None
    claimed = ClaimRow._make(row)
    if claimed.item_id is None:
        return None
    if partitioning.runs.layout(params.db) is not None:
        run = run_state(params.db, claimed, params.token, params.worker)
        if run is None:
            return None
        claimed = claimed.with_run(run)
    return claimed.claimed()


def claim(params: ClaimParams) -> Claimed | None:
    ctes, select, values, turns = _claim_parts(params)
    row = _execute_claim(params.db, queries.CLAIM.format(claim_ctes=ctes, claim_select=select), values, turns)[0]
    return _claimed(row, params)


def batches(db: str, queues: list[str] | None) -> bool:
    """Whether claims and endings may go in batches here (claim_many, finish_runs): on plain
    tables, for a worker of every queue or of one, none of them limited. Elsewhere one at a time."""
    return (partitioning.runs.layout(db) is None and partitioning.layout(db) is None
            and (queues is None or len(queues) == 1) and not durable_queues.served(queues))


_claim_many_sql: dict = {}

# Set in the transaction of a batch's statement (one round trip with it, _in_transaction). Its rows
# are named by `= ANY(ARRAY(...))`, which PostgreSQL may plan as a scan of the whole table while
# the table looks small (a fresh install, never analyzed), and a prepared statement keeps its plan
# as the table grows: with sequential scans off, each is planned as a lookup through its index
# whatever the statistics say (tests/test_plans.py).
_INDEXED = ("SET LOCAL enable_seqscan TO off", [])
# And for a batch from the claimer's floor: without bitmap scans. The generic plan of its first part
# (the items of a higher priority, mostly none) guesses a row or two, and would read them all
# through a bitmap and sort them rather than walk the index in order to the first k (tests/test_plans.py).
_ORDERED = ("SET LOCAL enable_bitmapscan TO off", [])
_PLACE_IN_PICK = operator.itemgetter(-1)  # a batch claim's row: its place in the pick (`n`) comes last


def claim_many(params: ClaimParams, tokens: list[uuid.UUID]) -> list[tuple[Claimed, uuid.UUID]]:
    """Claim up to len(tokens) ready items (queries.CLAIM_MANY), each with its own token; return
    (the claim, its token) of each, in claim order. Only where batches() allows.

    Committed as every claim is, synchronously: a claim committed without waiting for its WAL
    (tried) is lost with a primary that dies before its synchronous standby has it, and the
    worker that ran the item then finds its claim gone (tests/harness/failover.py saw it); one
    claim per batch made it worth nothing measurable. BEGIN, the setting, the claim and COMMIT go
    in one pipeline: one round trip.
    """
    db, k, floor = params.db, len(tokens), params.floor
    key = (db, tuple(params.queues or ()), clock.now_sql("postgresql"), k, floor is not None)
    sql = _claim_many_sql.get(key)
    if sql is None:
        ready = WorkItem.objects.using(db).ready(params.queues)
        if floor is not None:
            pick, pick_params = _after_floor(ready, db, k)
        else:
            pick, pick_params = _compiled(ready.select_for_update(skip_locked=True, no_key=True).values("id")[:k], db)
        if len(_claim_many_sql) > 64:
            _claim_many_sql.clear()
        select = _fill(queries.CLAIM_SELECT, entry=_ENTRY, message=_MESSAGE, child=_CHILD)
        select = select.replace("\nFROM claimed AS c", ", c.claim_token, c.n\nFROM claimed AS c", 1)
        sql = _claim_many_sql[key] = (_fill(queries.CLAIM_MANY, pick=pick, claim_select=select,
                                            snapshot_moved=queries.SNAPSHOT_MOVED), list(pick_params))
    sql, pick_params = sql
    values = [*_filled(pick_params, 0, floor), statements.Binary(tokens), params.worker, params.lease]
    rows = statements.in_transaction(db, [_INDEXED, _ORDERED] if floor is not None else [_INDEXED], sql, values,
                                     all_rows=True)
    rows.sort(key=_PLACE_IN_PICK)  # as picked: the UPDATE answers in the order its join read the rows
    return [(claimed, row[-2]) for row in rows if (claimed := ClaimRow._make(row[:-2]).claimed()) is not None]


def finish_runs(endings: list[Ending]) -> dict[int, str]:
    """End the runs of several claims `completed` (queries.FINISH_RUNS), each fenced by its own
    item's token, with their last journal entries; return {item id: the status its run ended
    with, or UNCHANGED if it had ended before}. An item missing from it lost its claim."""
    db = endings[0].claim.db
    records = [(ending.claim, record) for ending in endings for record in ending.records]
    steps = ""
    step_params: list = []
    consumed = [(record.consumes, record.key, claim.run_id) for claim, record in records if record.consumes is not None]
    if consumed:
        steps += _fill(queries.CONSUMED_MANY, rows=", ".join(["(%s::bigint, %s::varchar, %s::uuid)"] * len(consumed)))
        step_params += [value for row in consumed for value in row]
    if records:
        steps += _fill(queries.END_STEPS_MANY, columns=_COLUMN_NAMES, rows=", ".join([_ROW] * len(records)))
        for claim, record in records:
            step_params += [claim.run_id, *record.values]
    sql = _fill(queries.FINISH_RUNS, steps=steps)
    binary = statements.Binary
    claims = [e.claim.unwritten() for e in endings]  # (worker, when) of each, as queries.claimed_by writes them
    params = [binary([e.claim.item_id for e in endings]), binary([e.claim.token for e in endings]),
              binary([e.claim.run_id for e in endings]), binary([e.result for e in endings]),
              binary([at for _, at in claims]), binary([worker for worker, _ in claims]), *step_params]
    ended = statements.in_transaction(db, [_INDEXED], sql, params)[0][0] or []
    return {item_id: status or UNCHANGED for item_id, status in ended}


def run_state(db: str, claimed: ClaimRow, token, worker: str) -> RunColumns | None:
    """Where runs are partitioned: the run of the item just claimed (queries.RUN_STATE, which also
    marks an advanced run `running`), or None if the claim is gone."""
    id_time = partitioning.runs.key(claimed.run_id, db)
    key = (partitioning.layout(db), clock.now_sql("postgresql"))
    sql = _run_state_sql.get(key)
    if sql is None:
        sql = _run_state_sql[key] = _fill(queries.RUN_STATE, entry=_ENTRY, message=_MESSAGE, child=_CHILD)
    row, count = statements.execute(db, sql, [claimed.item_id, token, worker[:200], claimed.run_id, claimed.kind,
                                   claimed.step_key, id_time, id_time, id_time])
    return RunColumns._make(row) if count else None


def _values(claim, records) -> tuple[str, list]:
    params = []
    for record in records:
        params.append(claim.run_id)
        params.extend(record.values)
    return ", ".join([_ROW] * len(records)), params


def _consumed(records) -> tuple[str, list]:
    """queries.CONSUMED for the messages these entries consume (or nothing), and its parameters."""
    consumed = [(r.consumes, r.key) for r in records if r.consumes is not None]
    if not consumed:
        return "", []
    rows = ", ".join(["(%s::bigint, %s::varchar)"] * len(consumed))
    return _fill(queries.CONSUMED, rows=rows), [value for pair in consumed for value in pair]


def record_steps(claim: Claim, records: list[StepRecord]) -> tuple[int, bool]:
    """Write the entries, fenced; return how many were written and whether a cancel was requested."""
    rows, params = _values(claim, records)
    consumed_sql, consumed_params = _consumed(records)
    sql = _fill(queries.RECORD_STEPS, consumed=consumed_sql, columns=_COLUMN_NAMES, rows=rows)
    written, cancel_requested = statements.execute(claim.db, sql, [claim.item_id, claim.token, *consumed_params,
                                                        *_journal_key(claim.run_id), *params, claim.run_id,
                                                        *given_run(claim.run_id)])[0]
    return written, bool(cancel_requested)


def _end(item_status_sql: str | None, claim, records, timers, items=(), available_at=None) -> tuple[str, list]:
    """queries.END_FENCE (or, with no `item_status_sql`, END_FENCE_DROP: the run's end) and the
    END_* parts this ending needs, filled in, and their parameters."""
    if item_status_sql is None:
        sql = queries.END_FENCE_DROP
    else:
        sql = _fill(queries.END_FENCE, item_status=item_status_sql,
                    available_at="%s" if available_at else f"COALESCE(turn, {clock.now_sql('postgresql')})")
    params = ([available_at] if available_at else []) + [claim.item_id, claim.token]
    consumed_sql, consumed_params = _consumed(records)
    sql += consumed_sql
    params.extend(consumed_params)
    if records:
        rows, values = _values(claim, records)
        sql += _fill(queries.END_STEPS, columns=_COLUMN_NAMES, rows=rows)
        params.extend([*_journal_key(claim.run_id), *values])
    if items:
        sql += _fill(queries.END_BRANCHES, rows=", ".join(["(%s::varchar, %s::varchar, %s::varchar, %s::text)"] * len(items)))
        params.extend(given_run(claim.run_id))
        for item in items:
            params.extend(item)
    if timers:
        sql += _fill(queries.END_TIMERS, rows=", ".join(["(%s::varchar, %s::varchar, %s::timestamptz)"] * len(timers)))
        for timer in timers:
            params.extend(timer)
    return sql, params


def _claimed_by(claim: Claim) -> list:
    """queries.claimed_by's parameters for `claim`'s end, in its order (when, worker, when)."""
    worker, at = claim.unwritten()
    return [at, worker, at]


def finish_run(claim: Claim, *, status: str, result: str | None, error: str | None, records: list[StepRecord],
               next_claim: ClaimParams | None = None) -> tuple[str | None, Claimed | None]:
    """The run's end by its worker (queries.FINISH_RUN, the twin of endings.record_end), fenced by
    its item, which it deletes.

    Return (the status the run ended with, UNCHANGED if it had ended before, or None if the claim
    is lost; the next claim, when `next_claim` asked for one in the same statement).
    """
    sql, params = _end(None, claim, records, ())
    sql += _fill(queries.FINISH_RUN)
    params.extend([status, result, error, *_claimed_by(claim), *given_run(claim.run_id)])
    fenced, final, claimed = _with_claim(claim, sql, params, queries.FINISH_RUN_OUTCOMES, next_claim,
                                         exclude=queries.FINISH_RUN_TOUCHES)
    if not fenced:
        return None, claimed
    return final or UNCHANGED, claimed


def release(claim: Claim, *, run_status: str, waiting_on: str, requeue: bool, records: list[StepRecord],
            timers: list[tuple[str, str, dt.datetime]], items: list[tuple[str, str, str, str]], notify: bool,
            next_claim: ClaimParams | None = None) -> tuple[bool, Claimed | None]:
    """Hand the run back, fenced; return (whether the fence held, the next claim or None)."""
    item_status = "'pending'" if requeue else "CASE WHEN wake THEN 'pending' ELSE 'completed' END"
    sql, params = _end(item_status, claim, records, timers, items)
    sql += _fill(queries.RELEASE)
    params.extend([run_status, waiting_on, *_claimed_by(claim), *given_run(claim.run_id)])
    outcomes = queries.RELEASE_OUTCOMES + ((queries.RELEASE_NOTIFY,) if notify or items else ())
    fenced, _, claimed = _with_claim(claim, sql, params, outcomes, next_claim)
    return fenced, claimed


def _with_claim(claim, sql, params, outcomes, next_claim: ClaimParams | None,
                exclude=()) -> tuple[bool, object, Claimed | None]:
    """Run the CTEs in `sql` (which end `claim`), then (with `next_claim`) claim the next item in
    the same statement.

    Return whether the fence held, the first of `outcomes`, and the next claim (or None).
    `exclude`: SQL conditions on the claimed item `w` for the items the CTEs change, which
    the claim must not take.
    """
    db = claim.db
    if next_claim is None:
        fence, outcome, *_ = statements.execute(db, queries.ENDED.format(ctes=sql, outcomes=", ".join(outcomes)), params)[0]
        return fence == 1, outcome, None
    ctes, select, claim_params, turns = _claim_parts(next_claim, exclude=exclude, ending=claim.item_id)
    statement = queries.ENDED_AND_CLAIMED.format(ctes=sql, outcomes=", ".join(outcomes),
                                                 claim_ctes=ctes, claim_select=select)
    # The row: the fence's count, the outcomes, then the claim's columns (ClaimRow) last.
    fence, outcome, *rest = _execute_claim(db, statement, [*params, *claim_params], turns)[0]
    return fence == 1, outcome, _claimed(rest[-len(ClaimRow._fields):], next_claim)


def finish_branch(claim: Claim, record: StepRecord, *, group: str, failed: bool, fail_fast: bool,
                  next_claim: ClaimParams | None = None) -> tuple[bool, Claimed | None]:
    """Record a branch's outcome and count it off its group, fenced; wake the run when the group
    is done (or, failing fast, at once, cancelling the group's branches not started yet).

    Return (whether the fence held, the next claim or None).
    """
    sql, params = _end("'completed'", claim, [record], ())
    sql += _fill(queries.FINISH_BRANCH)
    params.extend([group, *_journal_key(claim.run_id), failed and fail_fast, group, failed and fail_fast])
    touched = queries.FINISH_BRANCH_TOUCHES
    if failed and fail_fast:
        touched += queries.FINISH_BRANCH_TOUCHES_FAIL_FAST
    fenced, _, claimed = _with_claim(claim, sql, params, queries.FINISH_BRANCH_OUTCOMES, next_claim, exclude=touched)
    return fenced, claimed


def retry_branch(claim: Claim, record: StepRecord, *, retry_at: dt.datetime,
                 next_claim: ClaimParams | None = None) -> tuple[bool, Claimed | None]:
    """Record a branch's failed attempt and queue it again for `retry_at`, fenced."""
    sql, params = _end("'pending'", claim, [record], (), available_at=retry_at)
    fenced, _, claimed = _with_claim(claim, sql, params, ("0",), next_claim)
    return fenced, claimed
