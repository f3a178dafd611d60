"""The workpool's hot path on PostgreSQL: every operation is one statement, one round trip, one commit.

Each statement runs in autocommit mode, so it is its own short transaction: no row lock outlives
it and no transaction stays open while user code runs. Data-modifying CTEs let one statement
claim a row, mark its run and read the run's journal, or fence, record and finish together.
"""

from __future__ import annotations

import logging

from django.db import DatabaseError, connections, transaction

from .. import clock, conf
from ..models import WorkflowRun, WorkItem
from ..journal import STEP_COLUMNS, UPSERT

_TERMINAL = ", ".join(f"'{status}'" for status in sorted(WorkflowRun.TERMINAL))

_COLUMN_NAMES = ", ".join(f'"{name}"' for name, _ in STEP_COLUMNS)
_ROW = "(" + ", ".join(f"%s::{sqltype}" for _, sqltype in STEP_COLUMNS) + ")"

_pick_cache: dict = {}

_ENTRY = ("json_build_array(s.key, s.seq, s.kind, s.name, s.status, s.result, s.error, s.attempts, "
          "s.deadline_at, s.retry_at, s.match)")

logger = logging.getLogger("django_durable.worker")

# Set to False after a pooler refused a prepared statement (PgBouncer in transaction mode
# before 1.21 loses them between transactions); then every statement is sent plain.
_prepare = True


def _cursor(db: str):
    """A cursor for the hot-path statements, prepared on PostgreSQL after their first uses.

    Parsing and planning these statements costs more than executing them. Django's cursors bind
    parameters client-side and never prepare, so user code in the worker is unaffected; this
    one cursor binds server-side on the same connection and session (an atomic step's
    checkpoint joins the step's transaction) and goes through Django's wrapper, so execute
    wrappers and error translation still apply.
    """
    connection = connections[db]
    # While Django logs queries (DEBUG, or a test counting them) the statements go unprepared:
    # the log of a prepared statement's execution has no SQL to show.
    if not (_prepare and conf.get("PREPARED_STATEMENTS")) or connection.queries_logged:
        return connection.cursor()
    import psycopg

    connection.ensure_connection()
    raw = connection.connection
    if raw.prepare_threshold is None:
        raw.prepare_threshold = 2
    return connection._prepare_cursor(psycopg.Cursor(raw))


def _execute(db: str, sql: str, params):
    """Run `sql`; return the cursor's first row and row count."""
    global _prepare
    try:
        with _cursor(db) as cursor:
            cursor.execute(sql, params)
            return (cursor.fetchone() if cursor.description else None), cursor.rowcount
    except DatabaseError as exc:
        import psycopg

        refused = (psycopg.errors.InvalidSqlStatementName, psycopg.errors.DuplicatePreparedStatement)
        if not (_prepare and isinstance(exc.__cause__, refused)):
            raise
        _prepare = False
        logger.warning("The database lost a prepared statement (a pooler in transaction mode?); "
                       "sending statements unprepared from now on.")
        if connections[db].in_atomic_block:
            raise  # the transaction is aborted; the caller's retry will go unprepared
        return _execute(db, sql, params)


def _pick(queues, db, avoid=()) -> tuple[str, list]:
    """SQL that locks the next ready item, built by the ORM's select_for_update(skip_locked=True).

    SKIP LOCKED: claimers never wait for each other, each takes the next row nobody holds.
    NO KEY UPDATE: the lock does not block inserts that reference the row.
    """
    key = (db, tuple(queues or ()), clock.now_sql("postgresql"), avoid)
    if key not in _pick_cache:
        locked = (
            WorkItem.objects.using(db)
            .ready(queues, avoid)
            .select_for_update(skip_locked=True, no_key=True)
            .values("id")[:1]
        )
        # The ORM compiles a locking query only inside a transaction; compiling sends nothing.
        with transaction.atomic(using=db):
            sql, params = locked.query.get_compiler(using=db).as_sql()
        if len(_pick_cache) > 64:
            _pick_cache.clear()
        _pick_cache[key] = (sql, list(params))
    return _pick_cache[key]


def _claim_parts(*, worker, queues, db, token, lease, avoid=(), exclude=()) -> tuple[str, str, list]:
    """The CTEs that claim the next ready item and mark its run, and the SELECT that reads them.

    They stand alone (a claim) or follow the CTEs that end a previous advance, so that one
    statement and one commit both finish a run and claim the next.
    """
    now = clock.now_sql("postgresql")
    pick_sql, pick_params = _pick(queues, db, avoid)
    # After CTEs that end an item, the pick sees the rows as they were before the statement; a
    # row may not be changed twice in one statement, so the claim leaves alone the items of the
    # runs those CTEs touch (which are then claimed by a statement of their own).
    chain_guard = " ".join(f"AND NOT COALESCE({condition}, false)" for condition in exclude)
    ctes = f"""
        picked AS ({pick_sql}),
        claimed AS (
            UPDATE durable_work_item AS w
            SET status = 'processing', claim_token = %s, claimed_by = %s,
                claim_expires_at = {now} + make_interval(secs => %s),
                attempts = w.attempts + 1, wake = false
            FROM picked WHERE w.id = picked.id {chain_guard}
            RETURNING w.id, w.kind, w.run_id, w.step_key, w.attempts, w.function, w.input, w.group
        ),
        run AS (
            -- Advancing makes the run `running`; a branch (a step item) leaves it waiting.
            UPDATE durable_workflow_run AS r
            SET status = 'running', started_at = COALESCE(r.started_at, {now}), updated_at = {now}, waiting_on = ''
            FROM claimed
            WHERE r.id = claimed.run_id AND claimed.kind = 'advance' AND r.status NOT IN ({_TERMINAL})
            RETURNING r.id
        )"""
    # The run's fields are read as they were before this statement (the update above changes
    # none of them); for an advance its journal and messages, for a branch its own entry.
    select = f"""
        SELECT c.id, c.kind, c.run_id, c.step_key, c.attempts, {now} AS db_now,
               CASE WHEN r.status NOT IN ({_TERMINAL}) THEN r.workflow END,
               r.input, r.attempt, r.max_attempts, r.deadline_at, r.cancel_requested_at IS NOT NULL,
               CASE WHEN c.kind = 'advance' THEN
                   (SELECT json_agg({_ENTRY}) FROM durable_step AS s WHERE s.run_id = c.run_id)
               ELSE  -- one lookup by (run, key), not a scan of a big fan-out's journal
                   (SELECT json_agg({_ENTRY}) FROM durable_step AS s WHERE s.run_id = c.run_id AND s.key = c.step_key)
               END AS journal,
               CASE WHEN c.kind = 'advance' THEN
                   (SELECT json_agg(json_build_array(m.id, m.kind, m.name, m.target_key, m.payload, m.created_at) ORDER BY m.id)
                    FROM durable_signal AS m WHERE m.run_id = c.run_id AND m.consumed_at IS NULL) END AS messages,
               (SELECT json_agg(json_build_array(k.id, k.status, k.result, k.error))
                FROM durable_workflow_run AS k
                WHERE c.kind = 'advance' AND k.parent_id = c.run_id AND k.status IN ({_TERMINAL})) AS children,
               c.function, c.input AS item_input, c.group
        FROM claimed AS c LEFT JOIN durable_workflow_run AS r ON r.id = c.run_id"""
    return ctes, select, [*pick_params, token, worker, lease]


def _claimed(row):
    from . import RunState

    if row is None or row[0] is None:
        return None
    item_id, kind, run_id, step_key, attempts, db_now, workflow, *state, journal, messages, children = row[:15]
    run = (RunState(workflow, *state, journal or [], messages or [], children or [])
           if workflow is not None else None)
    return item_id, kind, run_id, step_key, attempts, db_now, run, row[15:18]


def claim(*, worker, queues, db, token, lease, avoid=()):
    ctes, select, params = _claim_parts(worker=worker, queues=queues, db=db, token=token, lease=lease, avoid=avoid)
    return _claimed(_execute(db, f"WITH {ctes} {select}", params)[0])


def _values(claim, records) -> tuple[str, list]:
    params = []
    for record in records:
        params.append(claim.run_id)
        params.extend(record.values)
    return ", ".join([_ROW] * len(records)), params


def _consumed(records, now: str) -> tuple[str, list]:
    """A CTE marking the messages these entries consume, only if the fence held."""
    consumed = [(r.consumes, r.key) for r in records if r.consumes is not None]
    if not consumed:
        return "", []
    rows = ", ".join(["(%s::bigint, %s::varchar)"] * len(consumed))
    sql = f""",
        consumed AS (
            UPDATE durable_signal AS m SET consumed_at = {now}, consumed_by = c.key
            FROM fence, (VALUES {rows}) AS c (id, key)
            WHERE m.id = c.id AND m.consumed_at IS NULL
            RETURNING 1
        )"""
    return sql, [value for pair in consumed for value in pair]


def record_steps(claim, records) -> tuple[int, bool]:
    """Write the entries, fenced; return how many were written and whether a cancel was requested."""
    # FOR SHARE holds off a reaper (which rewrites the token) until this insert commits; if the
    # reaper committed first, the fence finds no row and nothing is inserted.
    now = clock.now_sql("postgresql")
    rows, params = _values(claim, records)
    consumed_sql, consumed_params = _consumed(records, now)
    sql = f"""
        WITH fence AS (
            SELECT 1 FROM durable_work_item WHERE id = %s AND claim_token = %s FOR SHARE
        ){consumed_sql},
        written AS (
            INSERT INTO durable_step ({_COLUMN_NAMES})
            SELECT v.* FROM fence, (VALUES {rows}) AS v ({_COLUMN_NAMES})
            {UPSERT}
            RETURNING 1
        )
        SELECT (SELECT count(*) FROM written),
               (SELECT cancel_requested_at IS NOT NULL FROM durable_workflow_run WHERE id = %s)
    """
    row = _execute(claim.db, sql, [claim.item_id, claim.token, *consumed_params, *params, claim.run_id])[0]
    return row[0], bool(row[1])


def _end(item_status_sql: str, now: str, claim, records, timers, items=(), available_at=None) -> tuple[str, list]:
    """The CTEs shared by finish and release: free the item (fenced), record the last entries,
    set the run's timers, queue its parallel branches. Everything after `fence` happens only if
    the fence held."""
    sql = f"""
        WITH fence AS (
            UPDATE durable_work_item
            SET status = {item_status_sql}, available_at = {"%s" if available_at else now}, claim_token = NULL,
                claimed_by = '', claim_expires_at = NULL, attempts = 0, wake = false, missing_since = NULL,
                step_key = CASE WHEN kind = 'advance' THEN '' ELSE step_key END
            WHERE id = %s AND claim_token = %s
            RETURNING run_id
        )"""
    params = ([available_at] if available_at else []) + [claim.item_id, claim.token]
    consumed_sql, consumed_params = _consumed(records, now)
    sql += consumed_sql
    params.extend(consumed_params)
    if records:
        rows, values = _values(claim, records)
        sql += f""",
        steps AS (
            INSERT INTO durable_step ({_COLUMN_NAMES})
            SELECT v.* FROM fence, (VALUES {rows}) AS v ({_COLUMN_NAMES})
            {UPSERT} RETURNING 1
        )"""
        params.extend(values)
    if items:
        rows = ", ".join(["(%s::varchar, %s::varchar, %s::varchar, %s::text)"] * len(items))
        sql += f""",
        branches AS (
            INSERT INTO durable_work_item (kind, run_id, step_key, "group", function, input, queue, priority,
                                           status, available_at, attempts, wake, claimed_by, last_error, created_at)
            SELECT 'step', fence.run_id, b.step_key, b.grp, b.function, b.input, r.queue, r.priority,
                   'pending', {now}, 0, false, '', '', {now}
            FROM fence JOIN durable_workflow_run AS r ON r.id = fence.run_id,
                 (VALUES {rows}) AS b (step_key, grp, function, input)
            RETURNING 1
        )"""
        for item in items:
            params.extend(item)
    if timers:
        rows = ", ".join(["(%s::varchar, %s::varchar, %s::timestamptz)"] * len(timers))
        sql += f""",
        timers AS (
            INSERT INTO durable_timer (kind, run_id, step_key, fire_at, status, created_at)
            SELECT t.kind, fence.run_id, t.step_key, t.fire_at, 'pending', {now}
            FROM fence, (VALUES {rows}) AS t (kind, step_key, fire_at)
            RETURNING 1
        )"""
        for timer in timers:
            params.extend(timer)
    return sql, params


def finish_run(claim, *, status, result, error, records, then=None):
    """Record the outcome, fenced; return (the status the run ended with, or None if the claim is
    lost; the next claim's row, when `then` asked for one in the same statement)."""
    now = clock.now_sql("postgresql")
    sql, params = _end("'completed'", now, claim, records, ())
    sql += f""",
        done AS (
            -- A cancel that committed first wins: the run ends cancelled, not with this outcome.
            UPDATE durable_workflow_run AS r
            SET status = CASE WHEN r.cancel_requested_at IS NULL THEN %s ELSE 'cancelled' END,
                result = CASE WHEN r.cancel_requested_at IS NULL THEN %s END,
                error = CASE WHEN r.cancel_requested_at IS NULL THEN %s ELSE r.error END,
                waiting_on = '', finished_at = {now}, updated_at = {now}
            FROM fence WHERE r.id = fence.run_id AND r.status NOT IN ({_TERMINAL})
            RETURNING r.status, r.parent_id
        ),
        -- Its branches not started yet will never be needed.
        unneeded AS (
            UPDATE durable_work_item AS o SET status = 'cancelled'
            FROM fence WHERE o.run_id = fence.run_id AND o.kind = 'step' AND o.status = 'pending'
            RETURNING 1
        ),
        -- A child's end wakes its parent, which may be waiting for it.
        parent AS (
            UPDATE durable_work_item AS p
            SET status = CASE WHEN p.status = 'completed' THEN 'pending' ELSE p.status END,
                available_at = CASE WHEN p.status = 'completed' THEN {now} ELSE p.available_at END,
                wake = CASE WHEN p.status = 'processing' THEN true ELSE p.wake END
            FROM done WHERE p.run_id = done.parent_id AND p.kind = 'advance'
            RETURNING 1
        ),
        quiet AS (
            -- SKIP LOCKED: a timer being fired right now holds its lock while it waits for the
            -- item this statement holds; it will only wake a finished run, which is harmless.
            UPDATE durable_timer SET status = 'cancelled'
            WHERE id IN (SELECT t.id FROM durable_timer AS t, fence
                         WHERE t.run_id = fence.run_id AND t.status = 'pending' FOR UPDATE SKIP LOCKED)
            RETURNING 1
        )"""
    params.extend([status, result, error])
    outcomes = ["(SELECT status FROM done)", "(SELECT pg_notify('durable_work', '') FROM parent LIMIT 1)"]
    touched = ("w.run_id = (SELECT run_id FROM fence)",  # its branches, cancelled above
               "w.run_id = (SELECT parent_id FROM done) AND w.kind = 'advance'")  # its parent, woken
    fenced, final, next_row = _with_claim(claim.db, sql, params, outcomes, then, exclude=touched)
    return ((final or status) if fenced == 1 else None), next_row


def release(claim, *, run_status, waiting_on, requeue, records, timers, items, notify, then=None):
    """Hand the run back, fenced; return (whether the fence held, the next claim's row or None)."""
    now = clock.now_sql("postgresql")
    item_status = "'pending'" if requeue else "CASE WHEN wake THEN 'pending' ELSE 'completed' END"
    sql, params = _end(item_status, now, claim, records, timers, items)
    sql += f""",
        moved AS (
            UPDATE durable_workflow_run AS r
            SET status = %s, waiting_on = %s, updated_at = {now}
            FROM fence WHERE r.id = fence.run_id AND r.status = 'running'
            RETURNING 1
        )"""
    params.extend([run_status, waiting_on])
    outcomes = ["(SELECT count(*) FROM moved)"] + (["pg_notify('durable_work', '')"] if notify or items else [])
    fenced, _, next_row = _with_claim(claim.db, sql, params, outcomes, then)
    return fenced == 1, next_row


def _with_claim(db, sql, params, outcomes: list[str], then, exclude=()) -> tuple[int, object, tuple | None]:
    """Run the CTEs in `sql`, then (with `then`) claim the next item in the same statement.

    Return the fence's count, the first of `outcomes`, and the next claim's row (or None).
    `exclude`: SQL conditions on the claimed item `w` for the items the CTEs change, which
    the claim must not take.
    """
    selected = ", ".join(["(SELECT count(*) FROM fence)", *outcomes])
    if then is None:
        row = _execute(db, f"{sql} SELECT {selected}", params)[0]
        return row[0], row[1], None
    ctes, select, claim_params = _claim_parts(**then, exclude=exclude)
    row = _execute(
        db,
        f"{sql}, {ctes} SELECT {selected}, nxt.* FROM (SELECT 1) AS one LEFT JOIN ({select}) AS nxt ON true",
        [*params, *claim_params],
    )[0]
    return row[0], row[1], _claimed(row[1 + len(outcomes):])


def finish_branch(claim, record, *, group, failed, fail_fast, then=None):
    """Record a branch's outcome and count it off its group, fenced; wake the run when the group
    is done (or, failing fast, at once, cancelling the group's branches not started yet).

    Branches finishing at once take turns on the group's row, so exactly one sees the count
    reach zero. Return (whether the fence held, the next claim's row or None).
    """
    now = clock.now_sql("postgresql")
    sql, params = _end("'completed'", now, claim, [record], ())
    sql += f""",
        grp AS (
            UPDATE durable_step AS g SET remaining = g.remaining - 1
            FROM fence WHERE g.run_id = fence.run_id AND g.key = %s
            RETURNING g.remaining
        ),
        stopped AS (
            UPDATE durable_work_item AS o SET status = 'cancelled'
            FROM fence WHERE %s AND o.run_id = fence.run_id AND o.kind = 'step' AND o."group" = %s
                        AND o.status = 'pending'
            RETURNING 1
        ),
        woke AS (
            UPDATE durable_work_item AS a
            SET status = CASE WHEN a.status = 'completed' THEN 'pending' ELSE a.status END,
                available_at = CASE WHEN a.status = 'completed' THEN {now} ELSE a.available_at END,
                wake = CASE WHEN a.status = 'processing' THEN true ELSE a.wake END
            FROM fence WHERE a.run_id = fence.run_id AND a.kind = 'advance'
                        AND (%s OR (SELECT remaining FROM grp) <= 0)
            RETURNING 1
        )"""
    params.extend([group, failed and fail_fast, group, failed and fail_fast])
    outcomes = ["(SELECT pg_notify('durable_work', '') FROM woke LIMIT 1)"]
    touched = ["w.run_id = (SELECT run_id FROM fence) AND w.kind = 'advance'"]  # the run, woken
    if failed and fail_fast:
        touched.append("w.run_id = (SELECT run_id FROM fence)")  # its branches, cancelled
    fenced, _, next_row = _with_claim(claim.db, sql, params, outcomes, then, exclude=touched)
    return fenced == 1, next_row


def retry_branch(claim, record, *, retry_at, then=None):
    """Record a branch's failed attempt and queue it again for `retry_at`, fenced."""
    now = clock.now_sql("postgresql")
    sql, params = _end("'pending'", now, claim, [record], (), available_at=retry_at)
    fenced, _, next_row = _with_claim(claim.db, sql, params, ["0"], then)
    return fenced == 1, next_row
