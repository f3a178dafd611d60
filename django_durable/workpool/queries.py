"""The PostgreSQL statements of the workpool's hot path, each named and commented whole.

A reviewer reads each statement here as the database runs it; `postgres.py` only fills in the
parts in braces and joins the pieces one statement needs. `tests/golden/postgres_statements.sql`
holds every assembled statement, so a change to any of them shows in review.

The parts in braces:
  {now}          the database's clock: statement_timestamp(), or the frozen test clock
  {terminal}     the statuses a run ends with ('cancelled', 'completed', 'failed', 'timed_out')
  {pick}         the ready item to lock: WorkItem.objects.ready(...).select_for_update(
                 skip_locked=True, no_key=True), compiled by the ORM (one definition of "ready");
                 for a worker of several queues, PICK_FROM_QUEUES around a probe of each
  {columns}      the journal's columns (journal.STEP_COLUMNS); {rows} one typed VALUES row each
  {upsert}       the journal's conflict rule (journal.UPSERT): a final entry is never replaced
  {key_column} {key_value} {own_partition} {group_partition}
                 where the journal is partitioned (partitioning.py): the partition key written
                 with each entry, and the condition that looks a run's entries up in its own
                 partition only; empty for a plain journal
  {entry} {message} {child}   the JSON array of a row, in the order of rows.Entry/Message/Child
  {claim_run} {claim_select}   what a claim does with its run: CLAIM_RUN and CLAIM_SELECT, or,
                 where the runs table is partitioned, nothing and CLAIM_ITEM_SELECT (then RUN_STATE)
  {fence_partition} {given_partition}
                 where the runs table is partitioned (partitioning/runs.py): the condition that
                 names the partition of the run of the fence, or of an id given as a parameter,
                 ``id_time = %s``, the run's id_time as a parameter (postgres.given_run); empty for a
                 plain table
  {id_time_column} {id_time_value}   the partition key a new run is written with (the same)

Every statement runs alone in autocommit (or inside an atomic step's transaction), so no row
lock outlives it. Every write after a claim is fenced: it happens only while the item still
carries the claim's token, which a reaper or an operator changes when it takes the claim away.

A part that works on the row an earlier part returned (at most one: the fence's item, the claimed
item, the ended run) names it by a scalar subquery, ``r.id = (SELECT run_id FROM fence)``, not by
a join to that part. The planner then looks the row up through its index whatever the tables'
statistics say. Joined instead, a part estimated at one row became a nested loop over a scan of
the whole table whenever the table looked small (a fresh install, never analyzed), and a worker's
prepared statement kept that plan while the table grew: every finish walked every pending item
(tests/test_plans.py explains each statement's plan in those states).
"""

from ..models import WorkflowRun, WorkItem, pool


def _set(columns: tuple[str, ...], values: dict[str, str]) -> str:
    """The SET list of an UPDATE writing `values` (column: SQL), which must name every column of
    `columns` (a model's END_COLUMNS), in its order: an end rendered from it writes them all."""
    if tuple(values) != columns:
        raise ValueError(f"An end writes {columns}, not {tuple(values)}.")
    return ",\n        ".join(f"{column} = {value}" for column, value in values.items())


def claim_item(token: str, worker: str, lease: str) -> str:
    """What a claim writes on the item `w` it takes (WorkItem.CLAIM_COLUMNS; the ORM's is
    WorkItemQuerySet.take), in SQL: its `token`, `worker` and `lease` (seconds) as SQL. `wake` is
    set when the item changed after the statement began (SNAPSHOT_MOVED)."""
    return _set(WorkItem.CLAIM_COLUMNS, {
        "status": "'processing'", "claim_token": token, "claimed_by": worker,
        "claim_expires_at": f"{{now}} + make_interval(secs => {lease})", "attempts": "w.attempts + 1",
        "wake": "{snapshot_moved}",
    })


def mark_running(worker: str) -> str:
    """What a claim of a run's advance writes on the run `r` (WorkflowRun.RUNNING_COLUMNS; the ORM's
    is WorkflowRunQuerySet.mark_running), in SQL, `worker` as SQL."""
    return _set(WorkflowRun.RUNNING_COLUMNS, {
        "status": "'running'", "started_at": "COALESCE(r.started_at, {now})", "updated_at": "{now}",
        "waiting_on": "''", "last_worker": worker, "last_claimed_at": "{now}",
    })


def claimed_by(worker: str, claimed_at: str) -> str:
    """What the end of a worker's turn writes of its claim on the run `r` (WorkflowRun.CLAIMED_COLUMNS;
    the ORM's is models.runs.claimed_values), in SQL: `worker` and `claimed_at` are SQL, both NULL
    where the claim wrote them itself (a claim of one item), which leaves the run's as they are. A
    claim taken in a batch writes nothing on its run (CLAIM_MANY): its turn's end says who ran it."""
    return _set(WorkflowRun.CLAIMED_COLUMNS, {
        "started_at": f"COALESCE(r.started_at, {claimed_at})", "last_worker": f"COALESCE({worker}, r.last_worker)",
        "last_claimed_at": f"COALESCE({claimed_at}, r.last_claimed_at)",
    })


def end_item(item_status: str, available_at: str) -> str:
    """What an item's end writes (WorkItem.END_COLUMNS; the ORM's is models.pool.end_values), in SQL:
    `item_status` and `available_at` are SQL (in a fair queue an item ready again is ready at its
    turn; a branch's retry gives its back-off)."""
    return _set(WorkItem.END_COLUMNS, {
        "status": item_status, "available_at": available_at, "claim_token": "NULL", "claimed_by": "''",
        "claim_expires_at": "NULL", "attempts": "0", "wake": "false", "missing_since": "NULL",
        "step_key": "CASE WHEN kind = 'advance' THEN '' ELSE step_key END",
    })


def end_run(status: str, result: str, error: str) -> str:
    """What a worker's end of run `r` writes (WorkflowRun.END_COLUMNS; the ORM's is
    WorkflowRunQuerySet.end), in SQL: `status`, `result` and `error` (SQL) unless a cancel
    committed first, which wins (the run ends cancelled, its cancel's error kept)."""
    asked = "r.cancel_requested_at IS NULL"
    return _set(WorkflowRun.END_COLUMNS, {
        "status": f"CASE WHEN {asked} THEN {status} ELSE 'cancelled' END",
        "result": f"CASE WHEN {asked} THEN {result} END",
        "error": f"CASE WHEN {asked} THEN {error} ELSE r.error END",
        "waiting_on": "''", "finished_at": "{now}", "updated_at": "{now}",
    })


# -- claim ---------------------------------------------------------------------------------------

# Lock the next ready item (SKIP LOCKED: claimers never wait for each other), take it for this
# worker with a fresh token and lease, and make its run `running` (an advance item only: a
# branch leaves its run waiting). `wake` is set (SNAPSHOT_MOVED) when the item changed after the
# statement began: what the claim reads of its run is as of then. Followed by CLAIM_SELECT, alone or after the CTEs that end the
# worker's previous item, so one statement both finishes a run and claims the next. Then
# {chain_guard} leaves out the items those CTEs change: a row may not change twice in a statement.
CLAIM_CTES = """
picked AS ({pick}),
claimed AS (
    UPDATE durable_work_item AS w
    SET """ + claim_item("%s", "%s", "%s") + """
    WHERE w.id = (SELECT id FROM picked) {chain_guard}
    RETURNING w.id, w.kind, w.run_id, w.step_key, w.attempts, w.function, w.input, w.group, w.queue, w.claimed_by,
              w.priority, w.available_at
){claim_run}{rated}"""

# Whether the item a claim locks changed after the claim's statement began (`w` is the version it
# locked; the subquery reads the version of the statement's snapshot). A claim's statement reads the
# run's journal, messages and children as of its start, and finds its item later: a wakeup that
# committed in between (a signal, an event, a child's or a branch's end) found the item pending and
# flagged nothing, so the claim would take the run without what woke it, and the run would wait
# for ever with it stored and unread. Every wakeup writes the item, pending or not (WAKE), so its
# version changes; the claim then sets `wake`, and the item goes again when this turn ends.
SNAPSHOT_MOVED = "w.xmin <> (SELECT s.xmin FROM durable_work_item AS s WHERE s.id = w.id)"

# {pick} of a worker of several queues: each queue's first ready item ({probe}: the ready items of
# `served.queue`, through the per-queue index, locked with SKIP LOCKED), and the first of those. It
# locks up to one item per queue for the moment of the statement; the others are free at its end.
PICK_FROM_QUEUES = """SELECT picked.id FROM unnest(%s::varchar[]) AS served (queue), LATERAL ({probe}) AS picked
    ORDER BY picked.priority DESC, picked.available_at, picked.id LIMIT 1"""

# The claimed item's run, marked `running` by the claim's statement: on a plain runs table. (Where
# runs are partitioned, RUN_STATE does it, see there.)
CLAIM_RUN = """,
run AS (
    -- Advancing makes the run `running`; a branch (a step item) leaves it waiting.
    UPDATE durable_workflow_run AS r
    SET """ + mark_running("claimed.claimed_by") + """
    FROM claimed
    WHERE r.id = (SELECT run_id FROM claimed WHERE kind = 'advance') AND r.status NOT IN ({terminal})
    RETURNING r.id
)"""

# With rate-limited queues among those claimed from (DURABLE_QUEUES): the claimed item's queue,
# if it is one, may be claimed again one interval from now ((queue, seconds) as two arrays).
CLAIM_RATE = """,
rated AS (
    INSERT INTO durable_queue (name, next_claim_at)
    SELECT claimed.queue, {now} + make_interval(secs => r.every)
    FROM claimed JOIN unnest(%s::varchar[], %s::float8[]) AS r (name, every) ON r.name = claimed.queue
    ON CONFLICT (name) DO UPDATE SET next_claim_at = EXCLUDED.next_claim_at
    RETURNING 1
)"""

# Before a claim from limited queues, in the same transaction: take each queue's turn, a lock
# held until the claim commits, in the order of the queues' names (so two claims never wait for
# each other in a circle). The claim's statement comes after it and so counts what is running
# with every earlier claim of the queue committed and no other one between its count and its
# commit: two workers never both take the last slot. Claims of other queues do not take turns.
QUEUE_TURN = """
SELECT count(pg_advisory_xact_lock(1146442305, hashtext(queue)))
FROM unnest(%s::text[]) AS turn (queue)"""

# What the worker needs of the claimed item, in the order of rows.Claimed: the item, the
# database's clock, the run's fields (read as they were before this statement; the UPDATE above
# changes none of them; the workflow is NULL for a run that has ended), and for an advance the
# whole journal, the messages not consumed yet and the children that have finished; for a
# branch only its own entry, one lookup by (run, key) and not a scan of a big fan-out.
CLAIM_SELECT = """
SELECT c.id, c.kind, c.run_id, c.step_key, c.attempts, {now} AS db_now,
       CASE WHEN r.status NOT IN ({terminal}) THEN r.workflow END,
       r.input, r.attempt, r.max_attempts, r.deadline_at, r.cancel_requested_at IS NOT NULL,
       CASE WHEN c.kind = 'advance' THEN
           (SELECT json_agg({entry}) FROM durable_step AS s WHERE s.run_id = c.run_id{own_partition})
       ELSE
           (SELECT json_agg({entry}) FROM durable_step AS s WHERE s.run_id = c.run_id AND s.key = c.step_key{own_partition})
       END AS journal,
       CASE WHEN c.kind = 'advance' THEN
           (SELECT json_agg({message} ORDER BY m.id)
            FROM durable_signal AS m WHERE m.run_id = c.run_id AND m.consumed_at IS NULL) END AS messages,
       (SELECT json_agg({child})
        FROM durable_workflow_run AS k
        WHERE c.kind = 'advance' AND k.parent_id = c.run_id AND k.status IN ({terminal})) AS children,
       c.function, c.input AS item_input, c.group, c.priority, c.available_at
FROM claimed AS c LEFT JOIN durable_workflow_run AS r ON r.id = c.run_id"""

# Where the runs table is partitioned, the claim's statement takes the item only, its run's
# columns left NULL (the same columns as CLAIM_SELECT); RUN_STATE reads the run after. A claim's
# statement could name the run's partition only from the run id it finds, and PostgreSQL starts a
# scan of every partition before it can leave them out (measured: a claim 0.3 ms slower at 14
# partitions, and a worker's every ending carries the claim of its next item, ready or not).
CLAIM_ITEM_SELECT = """
SELECT c.id, c.kind, c.run_id, c.step_key, c.attempts, {now} AS db_now,
       NULL::varchar, NULL::text, NULL::integer, NULL::integer, NULL::timestamptz, NULL::boolean,
       NULL::json AS journal, NULL::json AS messages, NULL::json AS children,
       c.function, c.input AS item_input, c.group, c.priority, c.available_at
FROM claimed AS c"""

# The claimed item's run where the runs table is partitioned, after CLAIM_ITEM_SELECT, given the
# claim (item id, token), the worker, the run's id, the item's kind and step key, and then the
# run's id_time for each of its three lookups: as parameters, so that PostgreSQL leaves the other
# partitions out before it starts (a value of `given` would be known only as it runs). It reads
# what CLAIM_SELECT reads of the run, and an advance makes it `running`, as CLAIM_RUN does. Fenced
# by the claim, as every write after a claim is: no row if the claim is gone.
RUN_STATE = """
WITH fence AS (
    SELECT 1 FROM durable_work_item WHERE id = %s AND claim_token = %s FOR SHARE
),
given AS (
    SELECT %s::varchar AS worker, %s::uuid AS run_id, %s::varchar AS kind, %s::varchar AS step_key
),
run AS (
    -- Advancing makes the run `running`; a branch (a step item) leaves it waiting.
    UPDATE durable_workflow_run AS r
    SET """ + mark_running("given.worker") + """
    FROM fence, given
    WHERE r.id = (SELECT run_id FROM given WHERE kind = 'advance') AND r.id_time = %s AND r.status NOT IN ({terminal})
    RETURNING r.id
)
SELECT CASE WHEN r.status NOT IN ({terminal}) THEN r.workflow END,
       r.input, r.attempt, r.max_attempts, r.deadline_at, r.cancel_requested_at IS NOT NULL,
       CASE WHEN given.kind = 'advance' THEN
           (SELECT json_agg({entry}) FROM durable_step AS s WHERE s.run_id = given.run_id{own_partition})
       ELSE
           (SELECT json_agg({entry}) FROM durable_step AS s
            WHERE s.run_id = given.run_id AND s.key = given.step_key{own_partition})
       END AS journal,
       CASE WHEN given.kind = 'advance' THEN
           (SELECT json_agg({message} ORDER BY m.id)
            FROM durable_signal AS m WHERE m.run_id = given.run_id AND m.consumed_at IS NULL) END AS messages,
       (SELECT json_agg({child})
        FROM durable_workflow_run AS k
        WHERE given.kind = 'advance' AND k.parent_id = given.run_id AND k.id_time = %s AND k.status IN ({terminal})
       ) AS children
FROM fence CROSS JOIN given LEFT JOIN durable_workflow_run AS r ON r.id = given.run_id AND r.id_time = %s"""

CLAIM = "WITH {claim_ctes} {claim_select}"

# The "wake" transition of a run's advance item (WorkItemQuerySet.wake in SQL), shared by the
# endings: a finished item is made ready now (in a fair queue at its turn: fairness.py), one being
# processed is flagged to go again when it ends, a pending one stays as it is but is written all
# the same (a claim under way notices: SNAPSHOT_MOVED). The runs are those whose id is {runs} ("= (SELECT ...)" of
# one run, "= ANY(ARRAY(SELECT ...))" of several); {when} narrows it.
WAKE = """
    UPDATE durable_work_item AS a
    SET status = CASE WHEN a.status = 'completed' THEN 'pending' ELSE a.status END,
        available_at = CASE WHEN a.status = 'completed' THEN COALESCE(a.turn, {now}) ELSE a.available_at END,
        wake = CASE WHEN a.status = 'processing' THEN true ELSE a.wake END
    WHERE a.run_id {runs} AND a.kind = 'advance'{when}
    RETURNING 1
"""

# What every end of a run drags along, for one run or many (as WAKE): its branches not started yet
# are cancelled, nothing will need them (the ORM's is endings.cancel_branches); its pending timers
# are cancelled (endings.cancel_timers), SKIP LOCKED: a timer being fired right now holds its lock
# while it waits for the item the end holds, and will only wake a finished run, which is harmless.
# {which} names the rows: by unneeded_branches() and pending_timers(), for one run or, a run at a
# time, for each of the batch's.
UNNEEDED = """
    UPDATE durable_work_item AS o SET status = 'cancelled'
    WHERE {which}
    RETURNING 1
"""
QUIET = """
    UPDATE durable_timer SET status = 'cancelled'
    WHERE id {which}
    RETURNING 1
"""


# A run's own rows are found through the index of its id, their status compared with 'pending' as
# a sub-select (models.pool.PENDING_UNSEEN says why).
PENDING_UNSEEN = f"({pool.PENDING_UNSEEN.sql})"


def unneeded_branches(alias: str, run: str) -> str:
    """The condition on work item `alias` of a branch of run `run` (SQL) not started yet."""
    return f"{alias}.run_id = {run} AND {alias}.kind = 'step' AND {alias}.status = {PENDING_UNSEEN}"


def pending_timers(run: str) -> str:
    """The pending timers of run `run` (SQL), locked, those being fired skipped."""
    return (f"SELECT t.id FROM durable_timer AS t WHERE t.run_id = {run} AND t.status = {PENDING_UNSEEN} "
            f"FOR UPDATE SKIP LOCKED")


# -- claiming and ending in batches -----------------------------------------------------------------
# With a backlog, a worker claims several items in one statement and ends the runs it completed
# in one statement (worker/process.py says when). Each item keeps its own token (the i-th of the
# array given, `picked.n`) and its own lease; every write after is fenced item by item, as a
# claim of one. Rows are named by `= ANY(ARRAY(SELECT ...))`, never by a join, for the reason
# this module begins with: a lookup through the index whatever the statistics say.

# Claim up to `k` ready items ({pick}: the ORM's ready query, LIMIT k, SKIP LOCKED) for this
# worker, each with its token. Their runs are not written: a batch is claimed ahead of its turns,
# which are quick (worker/process.py goes to batches only after quick ones), and a run then goes
# from its status to its outcome; the end of its turn writes who claimed it and when (claimed_by),
# and one still running after a moment is marked `running` then (claims.mark_running). Answers a
# row per item: CLAIM_SELECT's columns, the item's token and its place in the pick (`n`): an
# UPDATE's rows come back in whatever order its join read them, and the caller puts them back in
# the pick's.
CLAIM_MANY = """
WITH picked AS (
    SELECT p.id, row_number() OVER () AS n FROM ({pick}) AS p
),
claimed AS (
    UPDATE durable_work_item AS w
    SET """ + claim_item("(%s::uuid[])[picked.n]", "%s", "%s") + """
    FROM picked
    WHERE w.id = picked.id
    RETURNING w.id, w.kind, w.run_id, w.step_key, w.attempts, w.function, w.input, w.group, w.queue, w.claimed_by,
              w.priority, w.available_at, w.claim_token, picked.n
)
{claim_select}"""

# The runs several claims completed, ended as FINISH_RUN ends one (each fenced by its own item's
# token, which the fence deletes; a cancel that committed first wins; branches not started are
# cancelled, the parent woken, timers quieted), with their last journal entries and the messages
# these consume ({steps}: CONSUMED_MANY and END_STEPS_MANY, or nothing). Given the items, their
# tokens, their runs, the runs' results, and when and by whom each was claimed (NULL for a claim
# of one item, which wrote it: claimed_by) as six arrays. Each run takes its values from `ending`
# by a join of the two (one hash of `ending` for the statement; a sub-select of `ending` in each
# column instead ran once a run and column: 0.03 ms a run). Answers [item, status] for each item
# whose fence held (status NULL: its run had ended before), and the NOTIFYs.
FINISH_RUNS = """
WITH ending AS (
    SELECT * FROM unnest(%s::bigint[], %s::uuid[], %s::uuid[], %s::text[], %s::timestamptz[], %s::varchar[])
        AS e (item_id, token, run_id, result, claimed_at, worker)
),
fence AS (
    DELETE FROM durable_work_item AS w
    USING ending AS e
    WHERE w.id = ANY(ARRAY(SELECT item_id FROM ending)) AND e.item_id = w.id AND w.claim_token = e.token
    RETURNING w.id, w.run_id
){steps},
done AS (
    UPDATE durable_workflow_run AS r
    SET """ + end_run("'completed'", "e.result", "NULL") + """,
        """ + claimed_by("e.worker", "e.claimed_at") + """
    FROM ending AS e
    WHERE r.id = ANY(ARRAY(SELECT run_id FROM fence)) AND e.run_id = r.id AND r.status NOT IN ({terminal})
    RETURNING r.id, r.status, r.parent_id, r.awaited
),
-- Each run's lookups by its id, one run at a time (LATERAL, kept apart by OFFSET 0): an equality
-- the planner takes through the index, as FINISH_RUN's; `= ANY` of all the runs, or the lateral
-- merged into a join, it planned as a walk of every pending item.
unneeded AS (""" + UNNEEDED.format(which="""o.id = ANY(ARRAY(
        SELECT b.id FROM fence AS f, LATERAL (
            SELECT x.id FROM durable_work_item AS x WHERE """ + unneeded_branches("x", "f.run_id") + """ OFFSET 0) AS b))""") + """),
parent AS (""" + WAKE.format(runs="= ANY(ARRAY(SELECT parent_id FROM done WHERE parent_id IS NOT NULL))",
                             when="", now="{now}") + """),
quiet AS (""" + QUIET.format(which="""= ANY(ARRAY(
        SELECT q.id FROM fence AS f, LATERAL (""" + pending_timers("f.run_id") + """) AS q))""") + """)
SELECT (SELECT json_agg(json_build_array(f.id, d.status)) FROM fence AS f LEFT JOIN done AS d ON d.id = f.run_id),
       (SELECT pg_notify('durable_work', '') FROM parent LIMIT 1),
       (SELECT count(pg_notify('durable_done', id::text)) FROM done WHERE awaited)"""

# The signals and events the last entries of the runs FINISH_RUNS ends consume, (id, key, run) rows,
# those of the runs whose fence held. (No `answered` part as in CONSUMED: the end quiets every
# pending timer of those runs.)
CONSUMED_MANY = """,
consumed AS (
    UPDATE durable_signal AS m SET consumed_at = {now}, consumed_by = c.key
    FROM (VALUES {rows}) AS c (id, key, run_id)
    WHERE m.id = c.id AND m.consumed_at IS NULL AND c.run_id = ANY(ARRAY(SELECT run_id FROM fence))
    RETURNING 1
)"""

# The last journal entries of the runs FINISH_RUNS ends ({rows}: one typed row each, its run's
# id first), those of the runs whose fence held.
END_STEPS_MANY = """,
steps AS (
    INSERT INTO durable_step ({columns})
    SELECT v.* FROM (VALUES {rows}) AS v ({columns})
    WHERE v.run_id = ANY(ARRAY(SELECT run_id FROM fence))
    {upsert} RETURNING 1
)"""

# -- journal writes while a step runs -------------------------------------------------------------

# Write journal entries (a step's start, a checkpoint) while the claim holds. FOR SHARE holds
# off a reaper (which rewrites the token) until this insert commits; if the reaper committed
# first, the fence finds no row and nothing is written. Answers how many entries were written
# and whether a cancel was requested meanwhile (the worker learns it at every checkpoint).
RECORD_STEPS = """
WITH fence AS (
    SELECT 1 FROM durable_work_item WHERE id = %s AND claim_token = %s FOR SHARE
){consumed},
written AS (
    INSERT INTO durable_step ({columns}{key_column})
    SELECT v.*{key_value} FROM fence, (VALUES {rows}) AS v ({columns})
    {upsert}
    RETURNING 1
)
SELECT (SELECT count(*) FROM written),
       (SELECT cancel_requested_at IS NOT NULL FROM durable_workflow_run WHERE id = %s{given_partition})
    """

# Mark consumed the signals and events the entries take, (id, key) rows, only if the fence held;
# the timeouts of the waits they answer never fire (SKIP LOCKED, as QUIET: a timeout being fired
# right now can only wake the run, which finds its wait answered); each found by its run's id
# (PENDING_UNSEEN says why). The ORM's is sqlite._consume.
CONSUMED = """,
consumed AS (
    UPDATE durable_signal AS m SET consumed_at = {now}, consumed_by = c.key
    FROM fence, (VALUES {rows}) AS c (id, key)
    WHERE m.id = c.id AND m.consumed_at IS NULL
    RETURNING m.run_id, c.key
),
answered AS (
    UPDATE durable_timer AS u SET status = 'cancelled'
    FROM consumed AS c, LATERAL (
        SELECT t.id FROM durable_timer AS t
        WHERE t.run_id = c.run_id AND t.step_key = c.key AND t.kind = 'signal_timeout'
          AND t.status = """ + PENDING_UNSEEN + """
        FOR UPDATE SKIP LOCKED) AS q
    WHERE u.id = q.id
    RETURNING 1
)"""

# -- ending an item: the CTEs every ending starts with --------------------------------------------

# Free the item, fenced by its token: the one transition "free" of the PostgreSQL path (the ORM's
# WorkItemQuerySet.free/end is the same for SQLite and the services). {item_status} is what it
# becomes; {available_at} when it is ready again if it is pending (now, or in a fair queue its
# turn: fairness.py; a branch's retry, its back-off). An advance item forgets the
# step it was on; a branch keeps its key. Everything after `fence` happens only if it held.
END_FENCE = """
WITH fence AS (
    UPDATE durable_work_item
    SET """ + end_item("{item_status}", "{available_at}") + """
    WHERE id = %s AND claim_token = %s
    RETURNING run_id, turn
)"""

# The fence of a run's end: the run will never be advanced again, so its advance item goes
# (endings.drop_advance is the ORM's). A retry of the ended run makes a new one
# (pending.back_to_pending). A delete writes no new version of the item, nor its index entries
# (bench/server_cost.py: a task's drain 15 index entries and 2.9 KB of WAL, against 18 and 3.2 KB
# when the item was ended instead); and the table holds only the work in flight.
END_FENCE_DROP = """
WITH fence AS (
    DELETE FROM durable_work_item
    WHERE id = %s AND claim_token = %s
    RETURNING run_id
)"""

# The last journal entries of the item ({rows}: one typed row each).
END_STEPS = """,
steps AS (
    INSERT INTO durable_step ({columns}{key_column})
    SELECT v.*{key_value} FROM fence, (VALUES {rows}) AS v ({columns})
    {upsert} RETURNING 1
)"""

# Queue the run's parallel branches, (step_key, group, function, input) rows, on the run's queue,
# with its priority and concurrency key (and in a fair queue at the run's turn: fairness.py).
END_BRANCHES = """,
branches AS (
    INSERT INTO durable_work_item (kind, run_id, step_key, "group", function, input, queue, priority, concurrency_key,
                                   status, available_at, turn, attempts, wake, claimed_by, last_error, created_at)
    SELECT 'step', fence.run_id, b.step_key, b.grp, b.function, b.input, r.queue, r.priority, r.concurrency_key,
           'pending', COALESCE(fence.turn, {now}), fence.turn, 0, false, '', '', {now}
    FROM fence,
         (SELECT queue, priority, concurrency_key FROM durable_workflow_run
          WHERE id = (SELECT run_id FROM fence){given_partition}) AS r,
         (VALUES {rows}) AS b (step_key, grp, function, input)
    RETURNING 1
)"""

# Set the run's timers, (kind, step_key, fire_at) rows: a sleep, a retry's back-off, a timeout.
END_TIMERS = """,
timers AS (
    INSERT INTO durable_timer (kind, run_id, step_key, fire_at, status, created_at)
    SELECT t.kind, fence.run_id, t.step_key, t.fire_at, 'pending', {now}
    FROM fence, (VALUES {rows}) AS t (kind, step_key, fire_at)
    RETURNING 1
)"""

# -- what each ending adds ------------------------------------------------------------------------

# A run's end (after END_FENCE_DROP): the SQL twin of endings.record_end, the one place every
# other ender ends a run (tests/test_endings.py drives both). Its outcome, unless a cancel
# committed first (then it ends cancelled); its branches not started yet are cancelled; its
# parent's advance item is woken (the "wake" transition: a finished item is made ready, one being
# processed is flagged to go again); its pending timers are cancelled. SKIP LOCKED on the timers:
# a timer being fired right now holds its lock while it waits for the item this statement
# deletes; it will find no item to wake.
FINISH_RUN = """,
done AS (
    -- A cancel that committed first wins: the run ends cancelled, not with this outcome.
    UPDATE durable_workflow_run AS r
    SET """ + end_run("%s", "%s", "%s") + """,
        """ + claimed_by("%s::varchar", "%s::timestamptz") + """
    WHERE r.id = (SELECT run_id FROM fence){fence_partition} AND r.status NOT IN ({terminal})
    RETURNING r.id, r.status, r.parent_id, r.awaited
),
-- Its branches not started yet will never be needed.
unneeded AS (""" + UNNEEDED.format(which=unneeded_branches("o", "(SELECT run_id FROM fence)")) + """),
-- A child's end wakes its parent, which may be waiting for it.
parent AS (""" + WAKE.format(runs="= (SELECT parent_id FROM done)", when="", now="{now}") + """),
quiet AS (""" + QUIET.format(which="IN (" + pending_timers("(SELECT run_id FROM fence)") + ")") + """)"""
# The run's status; a NOTIFY for idle workers if its parent was woken; and its end announced to
# a durable.wait() that marked it (`awaited`), only then: a NOTIFY serializes commits.
FINISH_RUN_OUTCOMES = ("(SELECT status FROM done)",
                       "(SELECT pg_notify('durable_work', '') FROM parent LIMIT 1)",
                       "(SELECT pg_notify('durable_done', id::text) FROM done WHERE awaited)")
# The items FINISH_RUN changes, which a chained claim must leave alone: the run's branches
# (cancelled) and its parent's advance item (woken).
FINISH_RUN_TOUCHES = ("w.run_id = (SELECT run_id FROM fence)",
                      "w.run_id = (SELECT parent_id FROM done) AND w.kind = 'advance'")

# A run handed back (after END_FENCE): it waits, or goes back to the queue (the SQL twin, for a
# worker's own run, of WorkflowRun.objects.back_to_pending()), with who claimed it (claimed_by).
# Only a run being advanced moves (`running`, or as it was for a claim taken in a batch:
# WorkflowRun.ADVANCING): one a cancel or an operator ended or held meanwhile keeps its status.
RELEASE = """,
moved AS (
    UPDATE durable_workflow_run AS r
    SET status = %s, waiting_on = %s, updated_at = {now},
        """ + claimed_by("%s::varchar", "%s::timestamptz") + """
    WHERE r.id = (SELECT run_id FROM fence){fence_partition} AND r.status IN ({advancing})
    RETURNING 1
)"""
RELEASE_OUTCOMES = ("(SELECT count(*) FROM moved)",)
RELEASE_NOTIFY = "pg_notify('durable_work', '')"

# A parallel branch's end (after END_FENCE with 'completed' and its entry): count it off its
# group's entry. Branches finishing at once take turns on that row, so exactly one sees the
# count reach zero and wakes the run; a failure with fail_fast wakes it at once and cancels the
# group's branches not started yet.
FINISH_BRANCH = """,
grp AS (
    UPDATE durable_step AS g SET remaining = g.remaining - 1
    WHERE g.run_id = (SELECT run_id FROM fence) AND g.key = %s{group_partition}
    RETURNING g.remaining
),
stopped AS (
    UPDATE durable_work_item AS o SET status = 'cancelled'
    WHERE %s AND """ + unneeded_branches("o", "(SELECT run_id FROM fence)") + """ AND o."group" = %s
    RETURNING 1
),
woke AS (""" + WAKE.format(runs="= (SELECT run_id FROM fence)", now="{now}",
                             when="\n      AND (%s OR (SELECT remaining FROM grp) <= 0)") + ")"
FINISH_BRANCH_OUTCOMES = ("(SELECT pg_notify('durable_work', '') FROM woke LIMIT 1)",)
FINISH_BRANCH_TOUCHES = ("w.run_id = (SELECT run_id FROM fence) AND w.kind = 'advance'",)  # the run, woken
FINISH_BRANCH_TOUCHES_FAIL_FAST = ("w.run_id = (SELECT run_id FROM fence)",)  # its branches, cancelled

# -- the answer -----------------------------------------------------------------------------------

# Every ending answers whether the fence held (0 or 1) and its outcomes, ...
ENDED = """{ctes}
SELECT (SELECT count(*) FROM fence), {outcomes}"""
# ... or, asked to claim the worker's next item in the same statement, those and the claim's row
# (all NULL when nothing was ready, which the LEFT JOIN keeps as one row).
ENDED_AND_CLAIMED = """{ctes}, {claim_ctes}
SELECT (SELECT count(*) FROM fence), {outcomes}, nxt.*
FROM (SELECT 1) AS one LEFT JOIN ({claim_select}) AS nxt ON true"""

# -- starting runs ----------------------------------------------------------------------------------

# Runs ready now and their advance items, in one statement (one round trip; its own commit, or
# part of the caller's transaction): the SQL twin of runs.insert_ready's ORM path. start() of one
# run ({runs} is START_ONE), start_many() and the schedules' fire times (START_MANY). Only for
# runs with no delay, deadline, parent or subject: those take runs.create_run's general path.
# {conflict} is empty, or ON CONFLICT DO NOTHING where a run may exist already (a schedule's fire
# time started by another worker): its item is then not inserted either, as only the runs
# inserted are returned. {notify} wakes idle workers. The timestamps of the runs and items come
# from the columns' defaults (the database's clock), but an item's `available_at` from {now}, so
# that a frozen test clock sees it ready. Answers how many runs, and the (last) run's created_at
# (its updated_at too: both are the transaction's now()).
START = """
WITH {turn}run AS (
    INSERT INTO durable_workflow_run (id, workflow, status, waiting_on, input, attempt, max_attempts, queue, priority,
                                      concurrency_key, idempotency_key, scheduled_at, detached{id_time_column})
    {runs}{conflict}
    RETURNING id, queue, priority, concurrency_key, created_at, updated_at
),
item AS (
    INSERT INTO durable_work_item (kind, run_id, step_key, "group", function, queue, priority, concurrency_key,
                                   status, available_at, attempts, wake, claimed_by, last_error{turn_column})
    SELECT 'advance', run.id, '', '', '', run.queue, run.priority, run.concurrency_key, 'pending', {available_at}, 0,
           false, '', ''{turn_value}
    FROM run{turns}
    RETURNING 1
)
SELECT count(*), max(created_at){notify} FROM run"""

# In a fair queue (fairness.py), {turn} is FAIR_TURN and the item's turn is its `available_at`
# (START_TURN); many runs' turns, taken before, are given as two arrays, run ids and their turns
# (START_TURNS: a run of a first-come queue among them has none and is ready now). Elsewhere the
# four parts are empty and the item is ready {now}.
START_TURN = {"available_at": "(SELECT turn FROM turn)", "turn_column": ", turn",
              "turn_value": ", (SELECT turn FROM turn)", "turns": ""}
START_TURNS = {"available_at": "COALESCE(f.turn, {now})", "turn_column": ", turn", "turn_value": ", f.turn",
               "turns": " LEFT JOIN unnest(%s::uuid[], %s::timestamptz[]) AS f (id, turn) ON f.id = run.id"}
START_FIRST_COME = {"available_at": "{now}", "turn_column": "", "turn_value": "", "turns": ""}

# One run: its id, workflow, input, max_attempts, queue, priority, concurrency key.
START_ONE = "VALUES (%s, %s, 'pending', '', %s, 1, %s, %s, %s, %s, NULL, NULL, false{id_time_value})"

# Many runs, a column each as an array (its ids, workflows, max_attempts, queues, priorities,
# concurrency keys, idempotency keys, fire times) and their inputs as one JSON array of the input
# texts, in the same order: nine parameters however many runs there are.
START_MANY = """SELECT given.id, given.workflow, 'pending', '', given.input, 1, given.max_attempts, given.queue,
           given.priority, given.concurrency_key, given.idempotency_key, given.scheduled_at, false{id_time_value}
    FROM unnest(%s::uuid[], %s::varchar[], %s::integer[], %s::varchar[], %s::integer[], %s::varchar[],
                %s::varchar[], %s::timestamptz[],
                ARRAY(SELECT e.value FROM json_array_elements_text(%s::json) WITH ORDINALITY AS e (value, n)
                      ORDER BY e.n))
         AS given (id, workflow, max_attempts, queue, priority, concurrency_key, idempotency_key, scheduled_at, input)"""

START_NOTIFY = ", pg_notify('durable_work', '')"

# One run's start wakes idle workers only if its queue has no ready item waiting already (one
# committed before this statement began). One waiting means the queue's workers are busy (they
# will come to this run as they finish) or have been told. A NOTIFY takes a lock of the whole
# server from the commit's start to its end, WAL flush included, so a NOTIFY per start made every
# producer's commit wait for every other's (measured: starts per second flat at ~1,000 from 16 to
# 64 producers, twice that without). A worker that goes idle looks once more a moment later
# (worker.process.SETTLE_SECONDS), for a start that committed just after its last claim and saw
# the item it was taking. Answers whether it saw one waiting (true: no NOTIFY sent), for the
# starts that follow it in this process (runs.READY_SEEN_SECONDS).
START_NOTIFY_IF_IDLE = """,
       CASE WHEN EXISTS (
            SELECT 1 FROM durable_work_item AS w
            WHERE w.status = 'pending' AND w.queue = (SELECT queue FROM run LIMIT 1) AND w.available_at <= {now})
       THEN true ELSE (SELECT false FROM pg_notify('durable_work', '')) END"""

# -- waiting for a run -------------------------------------------------------------------------------

# durable.wait(): the channel a run's end is announced on (its id as the payload), and the
# statement that marks a run as waited for and reads it. The mark and the worker's end of the
# run both update its row, so one sees the other: the run ends announced, or the wait sees it ended.
DONE_CHANNEL = "durable_done"
# ctx.write_stream(): the channel a run's new stream value is announced on (its id as the payload).
STREAM_CHANNEL = "durable_stream"
AWAIT = """
UPDATE durable_workflow_run SET awaited = true WHERE id = %s{given_partition}
RETURNING status, result, error, queue"""

# The end of runs ended outside a worker's statement (a cancel, a forced failure, the reaper's
# poison), announced to the waits that marked them; delivered when the transaction commits.
ANNOUNCE = "SELECT pg_notify('durable_done', id::text) FROM durable_workflow_run WHERE id = ANY(%s) AND awaited"


# -- fair queues ------------------------------------------------------------------------------------

# Give `n` new items of a key of a fair queue their turns (fairness.py), given the queue, the key,
# n, the key's weight w and the queue again. The key's row holds the last turn it gave and how many
# items took it (at most w). A key behind the queue's clock (the `available_at` of the queue's first
# ready item, or now) starts again at the clock; otherwise its items take the turns after its last,
# w items to a turn, a microsecond apart. Answers the row as it is after (fairness.given() works out
# each item's turn from it). The row stays locked until the statement's transaction commits, so
# starts of one key take turns. Its SQLite twin is fairness._take.
FAIR_TURN = """fair AS (
    SELECT %s::varchar AS queue, %s::varchar AS key, %s::integer AS n, %s::integer AS w,
           COALESCE((SELECT h.available_at FROM durable_work_item AS h
                     WHERE h.status = 'pending' AND h.queue = %s AND h.available_at <= {now}
                     ORDER BY h.priority DESC, h.available_at, h.id LIMIT 1), {now}) AS clock
),
turn AS (
    INSERT INTO durable_fair_turn AS t (queue, key, turn, used)
    SELECT fair.queue, fair.key, fair.clock + interval '1 microsecond' * ((fair.n - 1) / fair.w),
           mod(fair.n - 1, fair.w) + 1
    FROM fair
    ON CONFLICT (queue, key) DO UPDATE SET
        turn = CASE WHEN t.turn < (SELECT clock FROM fair) THEN EXCLUDED.turn
                    ELSE t.turn + interval '1 microsecond' * ((t.used + (SELECT n - 1 FROM fair)) / (SELECT w FROM fair))
               END,
        used = CASE WHEN t.turn < (SELECT clock FROM fair) THEN EXCLUDED.used
                    ELSE mod(t.used + (SELECT n - 1 FROM fair), (SELECT w FROM fair)) + 1 END
    RETURNING t.turn, t.used
)"""
FAIR_TURN_ALONE = "WITH " + FAIR_TURN + "\nSELECT turn, used FROM turn"
