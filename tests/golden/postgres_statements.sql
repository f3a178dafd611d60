-- The workpool's PostgreSQL statements, assembled from workpool/queries.py.
-- Written by tests/test_statements.py; review a diff here like code.

-- name: claim (3 parameters)
WITH
picked AS (SELECT "durable_work_item"."id" AS "id" FROM "durable_work_item" WHERE ("durable_work_item"."available_at" <= (STATEMENT_TIMESTAMP()) AND "durable_work_item"."status" = ('pending') AND NOT ("durable_work_item"."queue" IN (SELECT name FROM durable_queue_control WHERE paused))) ORDER BY "durable_work_item"."priority" DESC, "durable_work_item"."available_at" ASC, 1 ASC LIMIT 1 FOR NO KEY UPDATE SKIP LOCKED),
claimed AS (
    UPDATE durable_work_item AS w
    SET status = 'processing',
        claim_token = %s,
        claimed_by = %s,
        claim_expires_at = statement_timestamp() + make_interval(secs => %s),
        attempts = w.attempts + 1,
        wake = w.xmin <> (SELECT s.xmin FROM durable_work_item AS s WHERE s.id = w.id)
    WHERE w.id = (SELECT id FROM picked)
    RETURNING w.id, w.kind, w.run_id, w.step_key, w.attempts, w.function, w.input, w.group, w.queue, w.claimed_by,
              w.priority, w.available_at
),
run AS (
    -- Advancing makes the run `running`; a branch (a step item) leaves it waiting.
    UPDATE durable_workflow_run AS r
    SET status = 'running',
        started_at = COALESCE(r.started_at, statement_timestamp()),
        updated_at = statement_timestamp(),
        waiting_on = '',
        last_worker = claimed.claimed_by,
        last_claimed_at = statement_timestamp()
    FROM claimed
    WHERE r.id = (SELECT run_id FROM claimed WHERE kind = 'advance') AND r.status NOT IN ('cancelled', 'compensation_failed', 'completed', 'failed', 'timed_out')
    RETURNING r.id
)
SELECT c.id, c.kind, c.run_id, c.step_key, c.attempts, statement_timestamp() AS db_now,
       CASE WHEN r.status NOT IN ('cancelled', 'compensation_failed', 'completed', 'failed', 'timed_out') THEN r.workflow END,
       r.input, r.attempt, r.max_attempts, r.deadline_at, r.cancel_requested_at IS NOT NULL,
       CASE WHEN c.kind = 'advance' THEN
           (SELECT json_agg(json_build_array(s.key, s.seq, s.kind, s.name, s.status, s.result, s.error, s.attempts, s.deadline_at, s.retry_at, s.match, s.fingerprint)) FROM durable_step AS s WHERE s.run_id = c.run_id)
       ELSE
           (SELECT json_agg(json_build_array(s.key, s.seq, s.kind, s.name, s.status, s.result, s.error, s.attempts, s.deadline_at, s.retry_at, s.match, s.fingerprint)) FROM durable_step AS s WHERE s.run_id = c.run_id AND s.key = c.step_key)
       END AS journal,
       CASE WHEN c.kind = 'advance' THEN
           (SELECT json_agg(json_build_array(m.id, m.kind, m.name, m.target_key, m.payload, m.created_at) ORDER BY m.id)
            FROM durable_signal AS m WHERE m.run_id = c.run_id AND m.consumed_at IS NULL) END AS messages,
       (SELECT json_agg(json_build_array(k.id, k.status, k.result, k.error))
        FROM durable_workflow_run AS k
        WHERE c.kind = 'advance' AND k.parent_id = c.run_id AND k.status IN ('cancelled', 'compensation_failed', 'completed', 'failed', 'timed_out')) AS children,
       c.function, c.input AS item_input, c.group, c.priority, c.available_at
FROM claimed AS c LEFT JOIN durable_workflow_run AS r ON r.id = c.run_id;

-- name: claim from the claimer's floor (7 parameters)
WITH
picked AS (WITH floor_above AS (SELECT "durable_work_item"."id" AS "id", "durable_work_item"."priority" AS "priority", "durable_work_item"."available_at" AS "available_at" FROM "durable_work_item" WHERE ("durable_work_item"."available_at" <= (STATEMENT_TIMESTAMP()) AND "durable_work_item"."status" = ('pending') AND NOT ("durable_work_item"."queue" IN (SELECT name FROM durable_queue_control WHERE paused)) AND ("durable_work_item"."priority" > %s)) ORDER BY 2 DESC, 3 ASC, 1 ASC LIMIT 1 FOR NO KEY UPDATE SKIP LOCKED), floor_from AS (SELECT "durable_work_item"."id" AS "id", "durable_work_item"."priority" AS "priority", "durable_work_item"."available_at" AS "available_at" FROM "durable_work_item" WHERE ("durable_work_item"."available_at" <= (STATEMENT_TIMESTAMP()) AND "durable_work_item"."status" = ('pending') AND NOT ("durable_work_item"."queue" IN (SELECT name FROM durable_queue_control WHERE paused)) AND ("durable_work_item"."priority" = %s AND ("durable_work_item"."available_at", "durable_work_item"."id") >= (%s, %s))) ORDER BY 2 DESC, 3 ASC, 1 ASC LIMIT 1 FOR NO KEY UPDATE SKIP LOCKED) SELECT p.id FROM (SELECT * FROM floor_above UNION ALL SELECT * FROM floor_from) AS p ORDER BY p.priority DESC, p.available_at, p.id LIMIT 1),
claimed AS (
    UPDATE durable_work_item AS w
    SET status = 'processing',
        claim_token = %s,
        claimed_by = %s,
        claim_expires_at = statement_timestamp() + make_interval(secs => %s),
        attempts = w.attempts + 1,
        wake = w.xmin <> (SELECT s.xmin FROM durable_work_item AS s WHERE s.id = w.id)
    WHERE w.id = (SELECT id FROM picked)
    RETURNING w.id, w.kind, w.run_id, w.step_key, w.attempts, w.function, w.input, w.group, w.queue, w.claimed_by,
              w.priority, w.available_at
),
run AS (
    -- Advancing makes the run `running`; a branch (a step item) leaves it waiting.
    UPDATE durable_workflow_run AS r
    SET status = 'running',
        started_at = COALESCE(r.started_at, statement_timestamp()),
        updated_at = statement_timestamp(),
        waiting_on = '',
        last_worker = claimed.claimed_by,
        last_claimed_at = statement_timestamp()
    FROM claimed
    WHERE r.id = (SELECT run_id FROM claimed WHERE kind = 'advance') AND r.status NOT IN ('cancelled', 'compensation_failed', 'completed', 'failed', 'timed_out')
    RETURNING r.id
)
SELECT c.id, c.kind, c.run_id, c.step_key, c.attempts, statement_timestamp() AS db_now,
       CASE WHEN r.status NOT IN ('cancelled', 'compensation_failed', 'completed', 'failed', 'timed_out') THEN r.workflow END,
       r.input, r.attempt, r.max_attempts, r.deadline_at, r.cancel_requested_at IS NOT NULL,
       CASE WHEN c.kind = 'advance' THEN
           (SELECT json_agg(json_build_array(s.key, s.seq, s.kind, s.name, s.status, s.result, s.error, s.attempts, s.deadline_at, s.retry_at, s.match, s.fingerprint)) FROM durable_step AS s WHERE s.run_id = c.run_id)
       ELSE
           (SELECT json_agg(json_build_array(s.key, s.seq, s.kind, s.name, s.status, s.result, s.error, s.attempts, s.deadline_at, s.retry_at, s.match, s.fingerprint)) FROM durable_step AS s WHERE s.run_id = c.run_id AND s.key = c.step_key)
       END AS journal,
       CASE WHEN c.kind = 'advance' THEN
           (SELECT json_agg(json_build_array(m.id, m.kind, m.name, m.target_key, m.payload, m.created_at) ORDER BY m.id)
            FROM durable_signal AS m WHERE m.run_id = c.run_id AND m.consumed_at IS NULL) END AS messages,
       (SELECT json_agg(json_build_array(k.id, k.status, k.result, k.error))
        FROM durable_workflow_run AS k
        WHERE c.kind = 'advance' AND k.parent_id = c.run_id AND k.status IN ('cancelled', 'compensation_failed', 'completed', 'failed', 'timed_out')) AS children,
       c.function, c.input AS item_input, c.group, c.priority, c.available_at
FROM claimed AS c LEFT JOIN durable_workflow_run AS r ON r.id = c.run_id;

-- name: claim from some queues, not the items just declined (6 parameters)
WITH
picked AS (SELECT picked.id FROM unnest(%s::varchar[]) AS served (queue), LATERAL (SELECT "durable_work_item"."id" AS "id", "durable_work_item"."priority" AS "priority", "durable_work_item"."available_at" AS "available_at" FROM "durable_work_item" WHERE ("durable_work_item"."available_at" <= (STATEMENT_TIMESTAMP()) AND "durable_work_item"."status" = ('pending') AND NOT ("durable_work_item"."queue" IN (SELECT name FROM durable_queue_control WHERE paused)) AND NOT ("durable_work_item"."id" IN (%s, %s)) AND "durable_work_item"."queue" >= served.queue AND "durable_work_item"."queue" <= served.queue) ORDER BY "durable_work_item"."queue" ASC, 2 DESC, 3 ASC, 1 ASC LIMIT 1 FOR NO KEY UPDATE SKIP LOCKED) AS picked
    ORDER BY picked.priority DESC, picked.available_at, picked.id LIMIT 1),
claimed AS (
    UPDATE durable_work_item AS w
    SET status = 'processing',
        claim_token = %s,
        claimed_by = %s,
        claim_expires_at = statement_timestamp() + make_interval(secs => %s),
        attempts = w.attempts + 1,
        wake = w.xmin <> (SELECT s.xmin FROM durable_work_item AS s WHERE s.id = w.id)
    WHERE w.id = (SELECT id FROM picked)
    RETURNING w.id, w.kind, w.run_id, w.step_key, w.attempts, w.function, w.input, w.group, w.queue, w.claimed_by,
              w.priority, w.available_at
),
run AS (
    -- Advancing makes the run `running`; a branch (a step item) leaves it waiting.
    UPDATE durable_workflow_run AS r
    SET status = 'running',
        started_at = COALESCE(r.started_at, statement_timestamp()),
        updated_at = statement_timestamp(),
        waiting_on = '',
        last_worker = claimed.claimed_by,
        last_claimed_at = statement_timestamp()
    FROM claimed
    WHERE r.id = (SELECT run_id FROM claimed WHERE kind = 'advance') AND r.status NOT IN ('cancelled', 'compensation_failed', 'completed', 'failed', 'timed_out')
    RETURNING r.id
)
SELECT c.id, c.kind, c.run_id, c.step_key, c.attempts, statement_timestamp() AS db_now,
       CASE WHEN r.status NOT IN ('cancelled', 'compensation_failed', 'completed', 'failed', 'timed_out') THEN r.workflow END,
       r.input, r.attempt, r.max_attempts, r.deadline_at, r.cancel_requested_at IS NOT NULL,
       CASE WHEN c.kind = 'advance' THEN
           (SELECT json_agg(json_build_array(s.key, s.seq, s.kind, s.name, s.status, s.result, s.error, s.attempts, s.deadline_at, s.retry_at, s.match, s.fingerprint)) FROM durable_step AS s WHERE s.run_id = c.run_id)
       ELSE
           (SELECT json_agg(json_build_array(s.key, s.seq, s.kind, s.name, s.status, s.result, s.error, s.attempts, s.deadline_at, s.retry_at, s.match, s.fingerprint)) FROM durable_step AS s WHERE s.run_id = c.run_id AND s.key = c.step_key)
       END AS journal,
       CASE WHEN c.kind = 'advance' THEN
           (SELECT json_agg(json_build_array(m.id, m.kind, m.name, m.target_key, m.payload, m.created_at) ORDER BY m.id)
            FROM durable_signal AS m WHERE m.run_id = c.run_id AND m.consumed_at IS NULL) END AS messages,
       (SELECT json_agg(json_build_array(k.id, k.status, k.result, k.error))
        FROM durable_workflow_run AS k
        WHERE c.kind = 'advance' AND k.parent_id = c.run_id AND k.status IN ('cancelled', 'compensation_failed', 'completed', 'failed', 'timed_out')) AS children,
       c.function, c.input AS item_input, c.group, c.priority, c.available_at
FROM claimed AS c LEFT JOIN durable_workflow_run AS r ON r.id = c.run_id;

-- name: record a step while it runs (19 parameters)
WITH fence AS (
    SELECT 1 FROM durable_work_item WHERE id = %s AND claim_token = %s FOR SHARE
),
written AS (
    INSERT INTO durable_step ("run_id", "key", "seq", "kind", "name", "status", "result", "error", "attempts", "started_at", "finished_at", "deadline_at", "retry_at", "match", "remaining", "fingerprint")
    SELECT v.* FROM fence, (VALUES (%s::uuid, %s::varchar, %s::integer, %s::varchar, %s::varchar, %s::varchar, %s::text, %s::text, %s::integer, %s::timestamptz, %s::timestamptz, %s::timestamptz, %s::timestamptz, %s::text, %s::integer, %s::varchar)) AS v ("run_id", "key", "seq", "kind", "name", "status", "result", "error", "attempts", "started_at", "finished_at", "deadline_at", "retry_at", "match", "remaining", "fingerprint")
    ON CONFLICT (run_id, key) DO UPDATE SET "kind" = EXCLUDED."kind", "name" = EXCLUDED."name", "status" = EXCLUDED."status", "result" = EXCLUDED."result", "error" = EXCLUDED."error", "attempts" = EXCLUDED."attempts", "started_at" = CASE WHEN durable_step.status = 'waiting' THEN durable_step.started_at ELSE EXCLUDED.started_at END, "finished_at" = EXCLUDED."finished_at", "deadline_at" = EXCLUDED."deadline_at", "retry_at" = EXCLUDED."retry_at", "match" = EXCLUDED."match", "remaining" = COALESCE(EXCLUDED."remaining", durable_step."remaining"), "fingerprint" = COALESCE(EXCLUDED."fingerprint", durable_step."fingerprint") WHERE durable_step.status NOT IN ('completed', 'failed')
    RETURNING 1
)
SELECT (SELECT count(*) FROM written),
       (SELECT cancel_requested_at IS NOT NULL FROM durable_workflow_run WHERE id = %s)
;

-- name: record a wait that consumes a signal (21 parameters)
WITH fence AS (
    SELECT 1 FROM durable_work_item WHERE id = %s AND claim_token = %s FOR SHARE
),
consumed AS (
    UPDATE durable_signal AS m SET consumed_at = statement_timestamp(), consumed_by = c.key
    FROM fence, (VALUES (%s::bigint, %s::varchar)) AS c (id, key)
    WHERE m.id = c.id AND m.consumed_at IS NULL
    RETURNING m.run_id, c.key
),
answered AS (
    UPDATE durable_timer AS u SET status = 'cancelled'
    FROM consumed AS c, LATERAL (
        SELECT t.id FROM durable_timer AS t
        WHERE t.run_id = c.run_id AND t.step_key = c.key AND t.kind = 'signal_timeout'
          AND t.status = (SELECT 'pending')
        FOR UPDATE SKIP LOCKED) AS q
    WHERE u.id = q.id
    RETURNING 1
),
written AS (
    INSERT INTO durable_step ("run_id", "key", "seq", "kind", "name", "status", "result", "error", "attempts", "started_at", "finished_at", "deadline_at", "retry_at", "match", "remaining", "fingerprint")
    SELECT v.* FROM fence, (VALUES (%s::uuid, %s::varchar, %s::integer, %s::varchar, %s::varchar, %s::varchar, %s::text, %s::text, %s::integer, %s::timestamptz, %s::timestamptz, %s::timestamptz, %s::timestamptz, %s::text, %s::integer, %s::varchar)) AS v ("run_id", "key", "seq", "kind", "name", "status", "result", "error", "attempts", "started_at", "finished_at", "deadline_at", "retry_at", "match", "remaining", "fingerprint")
    ON CONFLICT (run_id, key) DO UPDATE SET "kind" = EXCLUDED."kind", "name" = EXCLUDED."name", "status" = EXCLUDED."status", "result" = EXCLUDED."result", "error" = EXCLUDED."error", "attempts" = EXCLUDED."attempts", "started_at" = CASE WHEN durable_step.status = 'waiting' THEN durable_step.started_at ELSE EXCLUDED.started_at END, "finished_at" = EXCLUDED."finished_at", "deadline_at" = EXCLUDED."deadline_at", "retry_at" = EXCLUDED."retry_at", "match" = EXCLUDED."match", "remaining" = COALESCE(EXCLUDED."remaining", durable_step."remaining"), "fingerprint" = COALESCE(EXCLUDED."fingerprint", durable_step."fingerprint") WHERE durable_step.status NOT IN ('completed', 'failed')
    RETURNING 1
)
SELECT (SELECT count(*) FROM written),
       (SELECT cancel_requested_at IS NOT NULL FROM durable_workflow_run WHERE id = %s)
;

-- name: finish a run (24 parameters)
WITH fence AS (
    DELETE FROM durable_work_item
    WHERE id = %s AND claim_token = %s
    RETURNING run_id
),
steps AS (
    INSERT INTO durable_step ("run_id", "key", "seq", "kind", "name", "status", "result", "error", "attempts", "started_at", "finished_at", "deadline_at", "retry_at", "match", "remaining", "fingerprint")
    SELECT v.* FROM fence, (VALUES (%s::uuid, %s::varchar, %s::integer, %s::varchar, %s::varchar, %s::varchar, %s::text, %s::text, %s::integer, %s::timestamptz, %s::timestamptz, %s::timestamptz, %s::timestamptz, %s::text, %s::integer, %s::varchar)) AS v ("run_id", "key", "seq", "kind", "name", "status", "result", "error", "attempts", "started_at", "finished_at", "deadline_at", "retry_at", "match", "remaining", "fingerprint")
    ON CONFLICT (run_id, key) DO UPDATE SET "kind" = EXCLUDED."kind", "name" = EXCLUDED."name", "status" = EXCLUDED."status", "result" = EXCLUDED."result", "error" = EXCLUDED."error", "attempts" = EXCLUDED."attempts", "started_at" = CASE WHEN durable_step.status = 'waiting' THEN durable_step.started_at ELSE EXCLUDED.started_at END, "finished_at" = EXCLUDED."finished_at", "deadline_at" = EXCLUDED."deadline_at", "retry_at" = EXCLUDED."retry_at", "match" = EXCLUDED."match", "remaining" = COALESCE(EXCLUDED."remaining", durable_step."remaining"), "fingerprint" = COALESCE(EXCLUDED."fingerprint", durable_step."fingerprint") WHERE durable_step.status NOT IN ('completed', 'failed') RETURNING 1
),
done AS (
    -- A cancel that committed first wins: the run ends cancelled, not with this outcome.
    UPDATE durable_workflow_run AS r
    SET status = CASE WHEN r.cancel_requested_at IS NULL THEN %s ELSE 'cancelled' END,
        result = CASE WHEN r.cancel_requested_at IS NULL THEN %s END,
        error = CASE WHEN r.cancel_requested_at IS NULL THEN %s ELSE r.error END,
        waiting_on = '',
        finished_at = statement_timestamp(),
        updated_at = statement_timestamp(),
        started_at = COALESCE(r.started_at, %s::timestamptz),
        last_worker = COALESCE(%s::varchar, r.last_worker),
        last_claimed_at = COALESCE(%s::timestamptz, r.last_claimed_at)
    WHERE r.id = (SELECT run_id FROM fence) AND r.status NOT IN ('cancelled', 'compensation_failed', 'completed', 'failed', 'timed_out')
    RETURNING r.id, r.status, r.parent_id, r.awaited
),
-- Its branches not started yet will never be needed.
unneeded AS (
    UPDATE durable_work_item AS o SET status = 'cancelled'
    WHERE o.run_id = (SELECT run_id FROM fence) AND o.kind = 'step' AND o.status = (SELECT 'pending')
    RETURNING 1
),
-- A child's end wakes its parent, which may be waiting for it.
parent AS (
    UPDATE durable_work_item AS a
    SET status = CASE WHEN a.status = 'completed' THEN 'pending' ELSE a.status END,
        available_at = CASE WHEN a.status = 'completed' THEN COALESCE(a.turn, statement_timestamp()) ELSE a.available_at END,
        wake = CASE WHEN a.status = 'processing' THEN true ELSE a.wake END
    WHERE a.run_id = (SELECT parent_id FROM done) AND a.kind = 'advance'
    RETURNING 1
),
quiet AS (
    UPDATE durable_timer SET status = 'cancelled'
    WHERE id IN (SELECT t.id FROM durable_timer AS t WHERE t.run_id = (SELECT run_id FROM fence) AND t.status = (SELECT 'pending') FOR UPDATE SKIP LOCKED)
    RETURNING 1
)
SELECT (SELECT count(*) FROM fence), (SELECT status FROM done), (SELECT pg_notify('durable_work', '') FROM parent LIMIT 1), (SELECT pg_notify('durable_done', id::text) FROM done WHERE awaited);

-- name: finish a run and claim the next item (27 parameters)
WITH fence AS (
    DELETE FROM durable_work_item
    WHERE id = %s AND claim_token = %s
    RETURNING run_id
),
steps AS (
    INSERT INTO durable_step ("run_id", "key", "seq", "kind", "name", "status", "result", "error", "attempts", "started_at", "finished_at", "deadline_at", "retry_at", "match", "remaining", "fingerprint")
    SELECT v.* FROM fence, (VALUES (%s::uuid, %s::varchar, %s::integer, %s::varchar, %s::varchar, %s::varchar, %s::text, %s::text, %s::integer, %s::timestamptz, %s::timestamptz, %s::timestamptz, %s::timestamptz, %s::text, %s::integer, %s::varchar)) AS v ("run_id", "key", "seq", "kind", "name", "status", "result", "error", "attempts", "started_at", "finished_at", "deadline_at", "retry_at", "match", "remaining", "fingerprint")
    ON CONFLICT (run_id, key) DO UPDATE SET "kind" = EXCLUDED."kind", "name" = EXCLUDED."name", "status" = EXCLUDED."status", "result" = EXCLUDED."result", "error" = EXCLUDED."error", "attempts" = EXCLUDED."attempts", "started_at" = CASE WHEN durable_step.status = 'waiting' THEN durable_step.started_at ELSE EXCLUDED.started_at END, "finished_at" = EXCLUDED."finished_at", "deadline_at" = EXCLUDED."deadline_at", "retry_at" = EXCLUDED."retry_at", "match" = EXCLUDED."match", "remaining" = COALESCE(EXCLUDED."remaining", durable_step."remaining"), "fingerprint" = COALESCE(EXCLUDED."fingerprint", durable_step."fingerprint") WHERE durable_step.status NOT IN ('completed', 'failed') RETURNING 1
),
done AS (
    -- A cancel that committed first wins: the run ends cancelled, not with this outcome.
    UPDATE durable_workflow_run AS r
    SET status = CASE WHEN r.cancel_requested_at IS NULL THEN %s ELSE 'cancelled' END,
        result = CASE WHEN r.cancel_requested_at IS NULL THEN %s END,
        error = CASE WHEN r.cancel_requested_at IS NULL THEN %s ELSE r.error END,
        waiting_on = '',
        finished_at = statement_timestamp(),
        updated_at = statement_timestamp(),
        started_at = COALESCE(r.started_at, %s::timestamptz),
        last_worker = COALESCE(%s::varchar, r.last_worker),
        last_claimed_at = COALESCE(%s::timestamptz, r.last_claimed_at)
    WHERE r.id = (SELECT run_id FROM fence) AND r.status NOT IN ('cancelled', 'compensation_failed', 'completed', 'failed', 'timed_out')
    RETURNING r.id, r.status, r.parent_id, r.awaited
),
-- Its branches not started yet will never be needed.
unneeded AS (
    UPDATE durable_work_item AS o SET status = 'cancelled'
    WHERE o.run_id = (SELECT run_id FROM fence) AND o.kind = 'step' AND o.status = (SELECT 'pending')
    RETURNING 1
),
-- A child's end wakes its parent, which may be waiting for it.
parent AS (
    UPDATE durable_work_item AS a
    SET status = CASE WHEN a.status = 'completed' THEN 'pending' ELSE a.status END,
        available_at = CASE WHEN a.status = 'completed' THEN COALESCE(a.turn, statement_timestamp()) ELSE a.available_at END,
        wake = CASE WHEN a.status = 'processing' THEN true ELSE a.wake END
    WHERE a.run_id = (SELECT parent_id FROM done) AND a.kind = 'advance'
    RETURNING 1
),
quiet AS (
    UPDATE durable_timer SET status = 'cancelled'
    WHERE id IN (SELECT t.id FROM durable_timer AS t WHERE t.run_id = (SELECT run_id FROM fence) AND t.status = (SELECT 'pending') FOR UPDATE SKIP LOCKED)
    RETURNING 1
),
picked AS (SELECT "durable_work_item"."id" AS "id" FROM "durable_work_item" WHERE ("durable_work_item"."available_at" <= (STATEMENT_TIMESTAMP()) AND "durable_work_item"."status" = ('pending') AND NOT ("durable_work_item"."queue" IN (SELECT name FROM durable_queue_control WHERE paused))) ORDER BY "durable_work_item"."priority" DESC, "durable_work_item"."available_at" ASC, 1 ASC LIMIT 1 FOR NO KEY UPDATE SKIP LOCKED),
claimed AS (
    UPDATE durable_work_item AS w
    SET status = 'processing',
        claim_token = %s,
        claimed_by = %s,
        claim_expires_at = statement_timestamp() + make_interval(secs => %s),
        attempts = w.attempts + 1,
        wake = w.xmin <> (SELECT s.xmin FROM durable_work_item AS s WHERE s.id = w.id)
    WHERE w.id = (SELECT id FROM picked) AND NOT COALESCE(w.run_id = (SELECT run_id FROM fence), false) AND NOT COALESCE(w.run_id = (SELECT parent_id FROM done) AND w.kind = 'advance', false)
    RETURNING w.id, w.kind, w.run_id, w.step_key, w.attempts, w.function, w.input, w.group, w.queue, w.claimed_by,
              w.priority, w.available_at
),
run AS (
    -- Advancing makes the run `running`; a branch (a step item) leaves it waiting.
    UPDATE durable_workflow_run AS r
    SET status = 'running',
        started_at = COALESCE(r.started_at, statement_timestamp()),
        updated_at = statement_timestamp(),
        waiting_on = '',
        last_worker = claimed.claimed_by,
        last_claimed_at = statement_timestamp()
    FROM claimed
    WHERE r.id = (SELECT run_id FROM claimed WHERE kind = 'advance') AND r.status NOT IN ('cancelled', 'compensation_failed', 'completed', 'failed', 'timed_out')
    RETURNING r.id
)
SELECT (SELECT count(*) FROM fence), (SELECT status FROM done), (SELECT pg_notify('durable_work', '') FROM parent LIMIT 1), (SELECT pg_notify('durable_done', id::text) FROM done WHERE awaited), nxt.*
FROM (SELECT 1) AS one LEFT JOIN (
SELECT c.id, c.kind, c.run_id, c.step_key, c.attempts, statement_timestamp() AS db_now,
       CASE WHEN r.status NOT IN ('cancelled', 'compensation_failed', 'completed', 'failed', 'timed_out') THEN r.workflow END,
       r.input, r.attempt, r.max_attempts, r.deadline_at, r.cancel_requested_at IS NOT NULL,
       CASE WHEN c.kind = 'advance' THEN
           (SELECT json_agg(json_build_array(s.key, s.seq, s.kind, s.name, s.status, s.result, s.error, s.attempts, s.deadline_at, s.retry_at, s.match, s.fingerprint)) FROM durable_step AS s WHERE s.run_id = c.run_id)
       ELSE
           (SELECT json_agg(json_build_array(s.key, s.seq, s.kind, s.name, s.status, s.result, s.error, s.attempts, s.deadline_at, s.retry_at, s.match, s.fingerprint)) FROM durable_step AS s WHERE s.run_id = c.run_id AND s.key = c.step_key)
       END AS journal,
       CASE WHEN c.kind = 'advance' THEN
           (SELECT json_agg(json_build_array(m.id, m.kind, m.name, m.target_key, m.payload, m.created_at) ORDER BY m.id)
            FROM durable_signal AS m WHERE m.run_id = c.run_id AND m.consumed_at IS NULL) END AS messages,
       (SELECT json_agg(json_build_array(k.id, k.status, k.result, k.error))
        FROM durable_workflow_run AS k
        WHERE c.kind = 'advance' AND k.parent_id = c.run_id AND k.status IN ('cancelled', 'compensation_failed', 'completed', 'failed', 'timed_out')) AS children,
       c.function, c.input AS item_input, c.group, c.priority, c.available_at
FROM claimed AS c LEFT JOIN durable_workflow_run AS r ON r.id = c.run_id) AS nxt ON true;

-- name: hand a run back to wait, with a timer and two parallel branches (34 parameters)
WITH fence AS (
    UPDATE durable_work_item
    SET status = CASE WHEN wake THEN 'pending' ELSE 'completed' END,
        available_at = COALESCE(turn, statement_timestamp()),
        claim_token = NULL,
        claimed_by = '',
        claim_expires_at = NULL,
        attempts = 0,
        wake = false,
        missing_since = NULL,
        step_key = CASE WHEN kind = 'advance' THEN '' ELSE step_key END
    WHERE id = %s AND claim_token = %s
    RETURNING run_id, turn
),
steps AS (
    INSERT INTO durable_step ("run_id", "key", "seq", "kind", "name", "status", "result", "error", "attempts", "started_at", "finished_at", "deadline_at", "retry_at", "match", "remaining", "fingerprint")
    SELECT v.* FROM fence, (VALUES (%s::uuid, %s::varchar, %s::integer, %s::varchar, %s::varchar, %s::varchar, %s::text, %s::text, %s::integer, %s::timestamptz, %s::timestamptz, %s::timestamptz, %s::timestamptz, %s::text, %s::integer, %s::varchar)) AS v ("run_id", "key", "seq", "kind", "name", "status", "result", "error", "attempts", "started_at", "finished_at", "deadline_at", "retry_at", "match", "remaining", "fingerprint")
    ON CONFLICT (run_id, key) DO UPDATE SET "kind" = EXCLUDED."kind", "name" = EXCLUDED."name", "status" = EXCLUDED."status", "result" = EXCLUDED."result", "error" = EXCLUDED."error", "attempts" = EXCLUDED."attempts", "started_at" = CASE WHEN durable_step.status = 'waiting' THEN durable_step.started_at ELSE EXCLUDED.started_at END, "finished_at" = EXCLUDED."finished_at", "deadline_at" = EXCLUDED."deadline_at", "retry_at" = EXCLUDED."retry_at", "match" = EXCLUDED."match", "remaining" = COALESCE(EXCLUDED."remaining", durable_step."remaining"), "fingerprint" = COALESCE(EXCLUDED."fingerprint", durable_step."fingerprint") WHERE durable_step.status NOT IN ('completed', 'failed') RETURNING 1
),
branches AS (
    INSERT INTO durable_work_item (kind, run_id, step_key, "group", function, input, queue, priority, concurrency_key,
                                   status, available_at, turn, attempts, wake, claimed_by, last_error, created_at)
    SELECT 'step', fence.run_id, b.step_key, b.grp, b.function, b.input, r.queue, r.priority, r.concurrency_key,
           'pending', COALESCE(fence.turn, statement_timestamp()), fence.turn, 0, false, '', '', statement_timestamp()
    FROM fence,
         (SELECT queue, priority, concurrency_key FROM durable_workflow_run
          WHERE id = (SELECT run_id FROM fence)) AS r,
         (VALUES (%s::varchar, %s::varchar, %s::varchar, %s::text), (%s::varchar, %s::varchar, %s::varchar, %s::text)) AS b (step_key, grp, function, input)
    RETURNING 1
),
timers AS (
    INSERT INTO durable_timer (kind, run_id, step_key, fire_at, status, created_at)
    SELECT t.kind, fence.run_id, t.step_key, t.fire_at, 'pending', statement_timestamp()
    FROM fence, (VALUES (%s::varchar, %s::varchar, %s::timestamptz)) AS t (kind, step_key, fire_at)
    RETURNING 1
),
moved AS (
    UPDATE durable_workflow_run AS r
    SET status = %s, waiting_on = %s, updated_at = statement_timestamp(),
        started_at = COALESCE(r.started_at, %s::timestamptz),
        last_worker = COALESCE(%s::varchar, r.last_worker),
        last_claimed_at = COALESCE(%s::timestamptz, r.last_claimed_at)
    WHERE r.id = (SELECT run_id FROM fence) AND r.status IN ('pending', 'running', 'waiting')
    RETURNING 1
)
SELECT (SELECT count(*) FROM fence), (SELECT count(*) FROM moved), pg_notify('durable_work', '');

-- name: hand a run back to the queue and claim the next item (10 parameters)
WITH fence AS (
    UPDATE durable_work_item
    SET status = 'pending',
        available_at = COALESCE(turn, statement_timestamp()),
        claim_token = NULL,
        claimed_by = '',
        claim_expires_at = NULL,
        attempts = 0,
        wake = false,
        missing_since = NULL,
        step_key = CASE WHEN kind = 'advance' THEN '' ELSE step_key END
    WHERE id = %s AND claim_token = %s
    RETURNING run_id, turn
),
moved AS (
    UPDATE durable_workflow_run AS r
    SET status = %s, waiting_on = %s, updated_at = statement_timestamp(),
        started_at = COALESCE(r.started_at, %s::timestamptz),
        last_worker = COALESCE(%s::varchar, r.last_worker),
        last_claimed_at = COALESCE(%s::timestamptz, r.last_claimed_at)
    WHERE r.id = (SELECT run_id FROM fence) AND r.status IN ('pending', 'running', 'waiting')
    RETURNING 1
),
picked AS (SELECT "durable_work_item"."id" AS "id" FROM "durable_work_item" WHERE ("durable_work_item"."available_at" <= (STATEMENT_TIMESTAMP()) AND "durable_work_item"."status" = ('pending') AND NOT ("durable_work_item"."queue" IN (SELECT name FROM durable_queue_control WHERE paused))) ORDER BY "durable_work_item"."priority" DESC, "durable_work_item"."available_at" ASC, 1 ASC LIMIT 1 FOR NO KEY UPDATE SKIP LOCKED),
claimed AS (
    UPDATE durable_work_item AS w
    SET status = 'processing',
        claim_token = %s,
        claimed_by = %s,
        claim_expires_at = statement_timestamp() + make_interval(secs => %s),
        attempts = w.attempts + 1,
        wake = w.xmin <> (SELECT s.xmin FROM durable_work_item AS s WHERE s.id = w.id)
    WHERE w.id = (SELECT id FROM picked)
    RETURNING w.id, w.kind, w.run_id, w.step_key, w.attempts, w.function, w.input, w.group, w.queue, w.claimed_by,
              w.priority, w.available_at
),
run AS (
    -- Advancing makes the run `running`; a branch (a step item) leaves it waiting.
    UPDATE durable_workflow_run AS r
    SET status = 'running',
        started_at = COALESCE(r.started_at, statement_timestamp()),
        updated_at = statement_timestamp(),
        waiting_on = '',
        last_worker = claimed.claimed_by,
        last_claimed_at = statement_timestamp()
    FROM claimed
    WHERE r.id = (SELECT run_id FROM claimed WHERE kind = 'advance') AND r.status NOT IN ('cancelled', 'compensation_failed', 'completed', 'failed', 'timed_out')
    RETURNING r.id
)
SELECT (SELECT count(*) FROM fence), (SELECT count(*) FROM moved), pg_notify('durable_work', ''), nxt.*
FROM (SELECT 1) AS one LEFT JOIN (
SELECT c.id, c.kind, c.run_id, c.step_key, c.attempts, statement_timestamp() AS db_now,
       CASE WHEN r.status NOT IN ('cancelled', 'compensation_failed', 'completed', 'failed', 'timed_out') THEN r.workflow END,
       r.input, r.attempt, r.max_attempts, r.deadline_at, r.cancel_requested_at IS NOT NULL,
       CASE WHEN c.kind = 'advance' THEN
           (SELECT json_agg(json_build_array(s.key, s.seq, s.kind, s.name, s.status, s.result, s.error, s.attempts, s.deadline_at, s.retry_at, s.match, s.fingerprint)) FROM durable_step AS s WHERE s.run_id = c.run_id)
       ELSE
           (SELECT json_agg(json_build_array(s.key, s.seq, s.kind, s.name, s.status, s.result, s.error, s.attempts, s.deadline_at, s.retry_at, s.match, s.fingerprint)) FROM durable_step AS s WHERE s.run_id = c.run_id AND s.key = c.step_key)
       END AS journal,
       CASE WHEN c.kind = 'advance' THEN
           (SELECT json_agg(json_build_array(m.id, m.kind, m.name, m.target_key, m.payload, m.created_at) ORDER BY m.id)
            FROM durable_signal AS m WHERE m.run_id = c.run_id AND m.consumed_at IS NULL) END AS messages,
       (SELECT json_agg(json_build_array(k.id, k.status, k.result, k.error))
        FROM durable_workflow_run AS k
        WHERE c.kind = 'advance' AND k.parent_id = c.run_id AND k.status IN ('cancelled', 'compensation_failed', 'completed', 'failed', 'timed_out')) AS children,
       c.function, c.input AS item_input, c.group, c.priority, c.available_at
FROM claimed AS c LEFT JOIN durable_workflow_run AS r ON r.id = c.run_id) AS nxt ON true;

-- name: finish a branch (25 parameters)
WITH fence AS (
    UPDATE durable_work_item
    SET status = 'completed',
        available_at = COALESCE(turn, statement_timestamp()),
        claim_token = NULL,
        claimed_by = '',
        claim_expires_at = NULL,
        attempts = 0,
        wake = false,
        missing_since = NULL,
        step_key = CASE WHEN kind = 'advance' THEN '' ELSE step_key END
    WHERE id = %s AND claim_token = %s
    RETURNING run_id, turn
),
steps AS (
    INSERT INTO durable_step ("run_id", "key", "seq", "kind", "name", "status", "result", "error", "attempts", "started_at", "finished_at", "deadline_at", "retry_at", "match", "remaining", "fingerprint")
    SELECT v.* FROM fence, (VALUES (%s::uuid, %s::varchar, %s::integer, %s::varchar, %s::varchar, %s::varchar, %s::text, %s::text, %s::integer, %s::timestamptz, %s::timestamptz, %s::timestamptz, %s::timestamptz, %s::text, %s::integer, %s::varchar)) AS v ("run_id", "key", "seq", "kind", "name", "status", "result", "error", "attempts", "started_at", "finished_at", "deadline_at", "retry_at", "match", "remaining", "fingerprint")
    ON CONFLICT (run_id, key) DO UPDATE SET "kind" = EXCLUDED."kind", "name" = EXCLUDED."name", "status" = EXCLUDED."status", "result" = EXCLUDED."result", "error" = EXCLUDED."error", "attempts" = EXCLUDED."attempts", "started_at" = CASE WHEN durable_step.status = 'waiting' THEN durable_step.started_at ELSE EXCLUDED.started_at END, "finished_at" = EXCLUDED."finished_at", "deadline_at" = EXCLUDED."deadline_at", "retry_at" = EXCLUDED."retry_at", "match" = EXCLUDED."match", "remaining" = COALESCE(EXCLUDED."remaining", durable_step."remaining"), "fingerprint" = COALESCE(EXCLUDED."fingerprint", durable_step."fingerprint") WHERE durable_step.status NOT IN ('completed', 'failed') RETURNING 1
),
grp AS (
    UPDATE durable_step AS g SET remaining = g.remaining - 1
    WHERE g.run_id = (SELECT run_id FROM fence) AND g.key = %s
    RETURNING g.remaining
),
stopped AS (
    UPDATE durable_work_item AS o SET status = 'cancelled'
    WHERE %s AND o.run_id = (SELECT run_id FROM fence) AND o.kind = 'step' AND o.status = (SELECT 'pending') AND o."group" = %s
    RETURNING 1
),
woke AS (
    UPDATE durable_work_item AS a
    SET status = CASE WHEN a.status = 'completed' THEN 'pending' ELSE a.status END,
        available_at = CASE WHEN a.status = 'completed' THEN COALESCE(a.turn, statement_timestamp()) ELSE a.available_at END,
        wake = CASE WHEN a.status = 'processing' THEN true ELSE a.wake END
    WHERE a.run_id = (SELECT run_id FROM fence) AND a.kind = 'advance'
      AND (%s OR (SELECT remaining FROM grp) <= 0)
    RETURNING 1
),
picked AS (SELECT "durable_work_item"."id" AS "id" FROM "durable_work_item" WHERE ("durable_work_item"."available_at" <= (STATEMENT_TIMESTAMP()) AND "durable_work_item"."status" = ('pending') AND NOT ("durable_work_item"."queue" IN (SELECT name FROM durable_queue_control WHERE paused))) ORDER BY "durable_work_item"."priority" DESC, "durable_work_item"."available_at" ASC, 1 ASC LIMIT 1 FOR NO KEY UPDATE SKIP LOCKED),
claimed AS (
    UPDATE durable_work_item AS w
    SET status = 'processing',
        claim_token = %s,
        claimed_by = %s,
        claim_expires_at = statement_timestamp() + make_interval(secs => %s),
        attempts = w.attempts + 1,
        wake = w.xmin <> (SELECT s.xmin FROM durable_work_item AS s WHERE s.id = w.id)
    WHERE w.id = (SELECT id FROM picked) AND NOT COALESCE(w.run_id = (SELECT run_id FROM fence) AND w.kind = 'advance', false)
    RETURNING w.id, w.kind, w.run_id, w.step_key, w.attempts, w.function, w.input, w.group, w.queue, w.claimed_by,
              w.priority, w.available_at
),
run AS (
    -- Advancing makes the run `running`; a branch (a step item) leaves it waiting.
    UPDATE durable_workflow_run AS r
    SET status = 'running',
        started_at = COALESCE(r.started_at, statement_timestamp()),
        updated_at = statement_timestamp(),
        waiting_on = '',
        last_worker = claimed.claimed_by,
        last_claimed_at = statement_timestamp()
    FROM claimed
    WHERE r.id = (SELECT run_id FROM claimed WHERE kind = 'advance') AND r.status NOT IN ('cancelled', 'compensation_failed', 'completed', 'failed', 'timed_out')
    RETURNING r.id
)
SELECT (SELECT count(*) FROM fence), (SELECT pg_notify('durable_work', '') FROM woke LIMIT 1), nxt.*
FROM (SELECT 1) AS one LEFT JOIN (
SELECT c.id, c.kind, c.run_id, c.step_key, c.attempts, statement_timestamp() AS db_now,
       CASE WHEN r.status NOT IN ('cancelled', 'compensation_failed', 'completed', 'failed', 'timed_out') THEN r.workflow END,
       r.input, r.attempt, r.max_attempts, r.deadline_at, r.cancel_requested_at IS NOT NULL,
       CASE WHEN c.kind = 'advance' THEN
           (SELECT json_agg(json_build_array(s.key, s.seq, s.kind, s.name, s.status, s.result, s.error, s.attempts, s.deadline_at, s.retry_at, s.match, s.fingerprint)) FROM durable_step AS s WHERE s.run_id = c.run_id)
       ELSE
           (SELECT json_agg(json_build_array(s.key, s.seq, s.kind, s.name, s.status, s.result, s.error, s.attempts, s.deadline_at, s.retry_at, s.match, s.fingerprint)) FROM durable_step AS s WHERE s.run_id = c.run_id AND s.key = c.step_key)
       END AS journal,
       CASE WHEN c.kind = 'advance' THEN
           (SELECT json_agg(json_build_array(m.id, m.kind, m.name, m.target_key, m.payload, m.created_at) ORDER BY m.id)
            FROM durable_signal AS m WHERE m.run_id = c.run_id AND m.consumed_at IS NULL) END AS messages,
       (SELECT json_agg(json_build_array(k.id, k.status, k.result, k.error))
        FROM durable_workflow_run AS k
        WHERE c.kind = 'advance' AND k.parent_id = c.run_id AND k.status IN ('cancelled', 'compensation_failed', 'completed', 'failed', 'timed_out')) AS children,
       c.function, c.input AS item_input, c.group, c.priority, c.available_at
FROM claimed AS c LEFT JOIN durable_workflow_run AS r ON r.id = c.run_id) AS nxt ON true;

-- name: finish a failed branch of a fail-fast group (25 parameters)
WITH fence AS (
    UPDATE durable_work_item
    SET status = 'completed',
        available_at = COALESCE(turn, statement_timestamp()),
        claim_token = NULL,
        claimed_by = '',
        claim_expires_at = NULL,
        attempts = 0,
        wake = false,
        missing_since = NULL,
        step_key = CASE WHEN kind = 'advance' THEN '' ELSE step_key END
    WHERE id = %s AND claim_token = %s
    RETURNING run_id, turn
),
steps AS (
    INSERT INTO durable_step ("run_id", "key", "seq", "kind", "name", "status", "result", "error", "attempts", "started_at", "finished_at", "deadline_at", "retry_at", "match", "remaining", "fingerprint")
    SELECT v.* FROM fence, (VALUES (%s::uuid, %s::varchar, %s::integer, %s::varchar, %s::varchar, %s::varchar, %s::text, %s::text, %s::integer, %s::timestamptz, %s::timestamptz, %s::timestamptz, %s::timestamptz, %s::text, %s::integer, %s::varchar)) AS v ("run_id", "key", "seq", "kind", "name", "status", "result", "error", "attempts", "started_at", "finished_at", "deadline_at", "retry_at", "match", "remaining", "fingerprint")
    ON CONFLICT (run_id, key) DO UPDATE SET "kind" = EXCLUDED."kind", "name" = EXCLUDED."name", "status" = EXCLUDED."status", "result" = EXCLUDED."result", "error" = EXCLUDED."error", "attempts" = EXCLUDED."attempts", "started_at" = CASE WHEN durable_step.status = 'waiting' THEN durable_step.started_at ELSE EXCLUDED.started_at END, "finished_at" = EXCLUDED."finished_at", "deadline_at" = EXCLUDED."deadline_at", "retry_at" = EXCLUDED."retry_at", "match" = EXCLUDED."match", "remaining" = COALESCE(EXCLUDED."remaining", durable_step."remaining"), "fingerprint" = COALESCE(EXCLUDED."fingerprint", durable_step."fingerprint") WHERE durable_step.status NOT IN ('completed', 'failed') RETURNING 1
),
grp AS (
    UPDATE durable_step AS g SET remaining = g.remaining - 1
    WHERE g.run_id = (SELECT run_id FROM fence) AND g.key = %s
    RETURNING g.remaining
),
stopped AS (
    UPDATE durable_work_item AS o SET status = 'cancelled'
    WHERE %s AND o.run_id = (SELECT run_id FROM fence) AND o.kind = 'step' AND o.status = (SELECT 'pending') AND o."group" = %s
    RETURNING 1
),
woke AS (
    UPDATE durable_work_item AS a
    SET status = CASE WHEN a.status = 'completed' THEN 'pending' ELSE a.status END,
        available_at = CASE WHEN a.status = 'completed' THEN COALESCE(a.turn, statement_timestamp()) ELSE a.available_at END,
        wake = CASE WHEN a.status = 'processing' THEN true ELSE a.wake END
    WHERE a.run_id = (SELECT run_id FROM fence) AND a.kind = 'advance'
      AND (%s OR (SELECT remaining FROM grp) <= 0)
    RETURNING 1
),
picked AS (SELECT "durable_work_item"."id" AS "id" FROM "durable_work_item" WHERE ("durable_work_item"."available_at" <= (STATEMENT_TIMESTAMP()) AND "durable_work_item"."status" = ('pending') AND NOT ("durable_work_item"."queue" IN (SELECT name FROM durable_queue_control WHERE paused))) ORDER BY "durable_work_item"."priority" DESC, "durable_work_item"."available_at" ASC, 1 ASC LIMIT 1 FOR NO KEY UPDATE SKIP LOCKED),
claimed AS (
    UPDATE durable_work_item AS w
    SET status = 'processing',
        claim_token = %s,
        claimed_by = %s,
        claim_expires_at = statement_timestamp() + make_interval(secs => %s),
        attempts = w.attempts + 1,
        wake = w.xmin <> (SELECT s.xmin FROM durable_work_item AS s WHERE s.id = w.id)
    WHERE w.id = (SELECT id FROM picked) AND NOT COALESCE(w.run_id = (SELECT run_id FROM fence) AND w.kind = 'advance', false) AND NOT COALESCE(w.run_id = (SELECT run_id FROM fence), false)
    RETURNING w.id, w.kind, w.run_id, w.step_key, w.attempts, w.function, w.input, w.group, w.queue, w.claimed_by,
              w.priority, w.available_at
),
run AS (
    -- Advancing makes the run `running`; a branch (a step item) leaves it waiting.
    UPDATE durable_workflow_run AS r
    SET status = 'running',
        started_at = COALESCE(r.started_at, statement_timestamp()),
        updated_at = statement_timestamp(),
        waiting_on = '',
        last_worker = claimed.claimed_by,
        last_claimed_at = statement_timestamp()
    FROM claimed
    WHERE r.id = (SELECT run_id FROM claimed WHERE kind = 'advance') AND r.status NOT IN ('cancelled', 'compensation_failed', 'completed', 'failed', 'timed_out')
    RETURNING r.id
)
SELECT (SELECT count(*) FROM fence), (SELECT pg_notify('durable_work', '') FROM woke LIMIT 1), nxt.*
FROM (SELECT 1) AS one LEFT JOIN (
SELECT c.id, c.kind, c.run_id, c.step_key, c.attempts, statement_timestamp() AS db_now,
       CASE WHEN r.status NOT IN ('cancelled', 'compensation_failed', 'completed', 'failed', 'timed_out') THEN r.workflow END,
       r.input, r.attempt, r.max_attempts, r.deadline_at, r.cancel_requested_at IS NOT NULL,
       CASE WHEN c.kind = 'advance' THEN
           (SELECT json_agg(json_build_array(s.key, s.seq, s.kind, s.name, s.status, s.result, s.error, s.attempts, s.deadline_at, s.retry_at, s.match, s.fingerprint)) FROM durable_step AS s WHERE s.run_id = c.run_id)
       ELSE
           (SELECT json_agg(json_build_array(s.key, s.seq, s.kind, s.name, s.status, s.result, s.error, s.attempts, s.deadline_at, s.retry_at, s.match, s.fingerprint)) FROM durable_step AS s WHERE s.run_id = c.run_id AND s.key = c.step_key)
       END AS journal,
       CASE WHEN c.kind = 'advance' THEN
           (SELECT json_agg(json_build_array(m.id, m.kind, m.name, m.target_key, m.payload, m.created_at) ORDER BY m.id)
            FROM durable_signal AS m WHERE m.run_id = c.run_id AND m.consumed_at IS NULL) END AS messages,
       (SELECT json_agg(json_build_array(k.id, k.status, k.result, k.error))
        FROM durable_workflow_run AS k
        WHERE c.kind = 'advance' AND k.parent_id = c.run_id AND k.status IN ('cancelled', 'compensation_failed', 'completed', 'failed', 'timed_out')) AS children,
       c.function, c.input AS item_input, c.group, c.priority, c.available_at
FROM claimed AS c LEFT JOIN durable_workflow_run AS r ON r.id = c.run_id) AS nxt ON true;

-- name: queue a branch again after its back-off (19 parameters)
WITH fence AS (
    UPDATE durable_work_item
    SET status = 'pending',
        available_at = %s,
        claim_token = NULL,
        claimed_by = '',
        claim_expires_at = NULL,
        attempts = 0,
        wake = false,
        missing_since = NULL,
        step_key = CASE WHEN kind = 'advance' THEN '' ELSE step_key END
    WHERE id = %s AND claim_token = %s
    RETURNING run_id, turn
),
steps AS (
    INSERT INTO durable_step ("run_id", "key", "seq", "kind", "name", "status", "result", "error", "attempts", "started_at", "finished_at", "deadline_at", "retry_at", "match", "remaining", "fingerprint")
    SELECT v.* FROM fence, (VALUES (%s::uuid, %s::varchar, %s::integer, %s::varchar, %s::varchar, %s::varchar, %s::text, %s::text, %s::integer, %s::timestamptz, %s::timestamptz, %s::timestamptz, %s::timestamptz, %s::text, %s::integer, %s::varchar)) AS v ("run_id", "key", "seq", "kind", "name", "status", "result", "error", "attempts", "started_at", "finished_at", "deadline_at", "retry_at", "match", "remaining", "fingerprint")
    ON CONFLICT (run_id, key) DO UPDATE SET "kind" = EXCLUDED."kind", "name" = EXCLUDED."name", "status" = EXCLUDED."status", "result" = EXCLUDED."result", "error" = EXCLUDED."error", "attempts" = EXCLUDED."attempts", "started_at" = CASE WHEN durable_step.status = 'waiting' THEN durable_step.started_at ELSE EXCLUDED.started_at END, "finished_at" = EXCLUDED."finished_at", "deadline_at" = EXCLUDED."deadline_at", "retry_at" = EXCLUDED."retry_at", "match" = EXCLUDED."match", "remaining" = COALESCE(EXCLUDED."remaining", durable_step."remaining"), "fingerprint" = COALESCE(EXCLUDED."fingerprint", durable_step."fingerprint") WHERE durable_step.status NOT IN ('completed', 'failed') RETURNING 1
)
SELECT (SELECT count(*) FROM fence), 0;

-- name: claim from a limited queue (DURABLE_QUEUES), statement 1 of 2 (1 parameters)
SELECT count(pg_advisory_xact_lock(1146442305, hashtext(queue)))
FROM unnest(%s::text[]) AS turn (queue);

-- name: claim from a limited queue (DURABLE_QUEUES), statement 2 of 2 (13 parameters)
WITH
picked AS (SELECT "durable_work_item"."id" AS "id" FROM "durable_work_item" WHERE ("durable_work_item"."available_at" <= (STATEMENT_TIMESTAMP()) AND "durable_work_item"."status" = ('pending') AND NOT ("durable_work_item"."queue" IN (SELECT name FROM durable_queue_control WHERE paused)) AND (("durable_work_item"."queue" <> %s OR ((SELECT COUNT(*) FROM "durable_work_item" AS "running" WHERE "running"."status" = 'processing' AND "running"."queue" = %s AND "running"."id" <> %s) < %s AND ("durable_work_item"."concurrency_key" = '' OR (SELECT COUNT(*) FROM "durable_work_item" AS "running" WHERE "running"."status" = 'processing' AND "running"."queue" = %s AND "running"."id" <> %s AND "running"."concurrency_key" = "durable_work_item"."concurrency_key") < %s) AND NOT EXISTS (SELECT 1 FROM "durable_queue" AS "rated" WHERE "rated"."name" = %s AND "rated"."next_claim_at" > statement_timestamp()))))) ORDER BY "durable_work_item"."priority" DESC, "durable_work_item"."available_at" ASC, 1 ASC LIMIT 1 FOR NO KEY UPDATE SKIP LOCKED),
claimed AS (
    UPDATE durable_work_item AS w
    SET status = 'processing',
        claim_token = %s,
        claimed_by = %s,
        claim_expires_at = statement_timestamp() + make_interval(secs => %s),
        attempts = w.attempts + 1,
        wake = w.xmin <> (SELECT s.xmin FROM durable_work_item AS s WHERE s.id = w.id)
    WHERE w.id = (SELECT id FROM picked)
    RETURNING w.id, w.kind, w.run_id, w.step_key, w.attempts, w.function, w.input, w.group, w.queue, w.claimed_by,
              w.priority, w.available_at
),
run AS (
    -- Advancing makes the run `running`; a branch (a step item) leaves it waiting.
    UPDATE durable_workflow_run AS r
    SET status = 'running',
        started_at = COALESCE(r.started_at, statement_timestamp()),
        updated_at = statement_timestamp(),
        waiting_on = '',
        last_worker = claimed.claimed_by,
        last_claimed_at = statement_timestamp()
    FROM claimed
    WHERE r.id = (SELECT run_id FROM claimed WHERE kind = 'advance') AND r.status NOT IN ('cancelled', 'compensation_failed', 'completed', 'failed', 'timed_out')
    RETURNING r.id
),
rated AS (
    INSERT INTO durable_queue (name, next_claim_at)
    SELECT claimed.queue, statement_timestamp() + make_interval(secs => r.every)
    FROM claimed JOIN unnest(%s::varchar[], %s::float8[]) AS r (name, every) ON r.name = claimed.queue
    ON CONFLICT (name) DO UPDATE SET next_claim_at = EXCLUDED.next_claim_at
    RETURNING 1
)
SELECT c.id, c.kind, c.run_id, c.step_key, c.attempts, statement_timestamp() AS db_now,
       CASE WHEN r.status NOT IN ('cancelled', 'compensation_failed', 'completed', 'failed', 'timed_out') THEN r.workflow END,
       r.input, r.attempt, r.max_attempts, r.deadline_at, r.cancel_requested_at IS NOT NULL,
       CASE WHEN c.kind = 'advance' THEN
           (SELECT json_agg(json_build_array(s.key, s.seq, s.kind, s.name, s.status, s.result, s.error, s.attempts, s.deadline_at, s.retry_at, s.match, s.fingerprint)) FROM durable_step AS s WHERE s.run_id = c.run_id)
       ELSE
           (SELECT json_agg(json_build_array(s.key, s.seq, s.kind, s.name, s.status, s.result, s.error, s.attempts, s.deadline_at, s.retry_at, s.match, s.fingerprint)) FROM durable_step AS s WHERE s.run_id = c.run_id AND s.key = c.step_key)
       END AS journal,
       CASE WHEN c.kind = 'advance' THEN
           (SELECT json_agg(json_build_array(m.id, m.kind, m.name, m.target_key, m.payload, m.created_at) ORDER BY m.id)
            FROM durable_signal AS m WHERE m.run_id = c.run_id AND m.consumed_at IS NULL) END AS messages,
       (SELECT json_agg(json_build_array(k.id, k.status, k.result, k.error))
        FROM durable_workflow_run AS k
        WHERE c.kind = 'advance' AND k.parent_id = c.run_id AND k.status IN ('cancelled', 'compensation_failed', 'completed', 'failed', 'timed_out')) AS children,
       c.function, c.input AS item_input, c.group, c.priority, c.available_at
FROM claimed AS c LEFT JOIN durable_workflow_run AS r ON r.id = c.run_id;

-- name: finish a run and claim the next item from a limited queue, statement 1 of 2 (1 parameters)
SELECT count(pg_advisory_xact_lock(1146442305, hashtext(queue)))
FROM unnest(%s::text[]) AS turn (queue);

-- name: finish a run and claim the next item from a limited queue, statement 2 of 2 (21 parameters)
WITH fence AS (
    DELETE FROM durable_work_item
    WHERE id = %s AND claim_token = %s
    RETURNING run_id
),
done AS (
    -- A cancel that committed first wins: the run ends cancelled, not with this outcome.
    UPDATE durable_workflow_run AS r
    SET status = CASE WHEN r.cancel_requested_at IS NULL THEN %s ELSE 'cancelled' END,
        result = CASE WHEN r.cancel_requested_at IS NULL THEN %s END,
        error = CASE WHEN r.cancel_requested_at IS NULL THEN %s ELSE r.error END,
        waiting_on = '',
        finished_at = statement_timestamp(),
        updated_at = statement_timestamp(),
        started_at = COALESCE(r.started_at, %s::timestamptz),
        last_worker = COALESCE(%s::varchar, r.last_worker),
        last_claimed_at = COALESCE(%s::timestamptz, r.last_claimed_at)
    WHERE r.id = (SELECT run_id FROM fence) AND r.status NOT IN ('cancelled', 'compensation_failed', 'completed', 'failed', 'timed_out')
    RETURNING r.id, r.status, r.parent_id, r.awaited
),
-- Its branches not started yet will never be needed.
unneeded AS (
    UPDATE durable_work_item AS o SET status = 'cancelled'
    WHERE o.run_id = (SELECT run_id FROM fence) AND o.kind = 'step' AND o.status = (SELECT 'pending')
    RETURNING 1
),
-- A child's end wakes its parent, which may be waiting for it.
parent AS (
    UPDATE durable_work_item AS a
    SET status = CASE WHEN a.status = 'completed' THEN 'pending' ELSE a.status END,
        available_at = CASE WHEN a.status = 'completed' THEN COALESCE(a.turn, statement_timestamp()) ELSE a.available_at END,
        wake = CASE WHEN a.status = 'processing' THEN true ELSE a.wake END
    WHERE a.run_id = (SELECT parent_id FROM done) AND a.kind = 'advance'
    RETURNING 1
),
quiet AS (
    UPDATE durable_timer SET status = 'cancelled'
    WHERE id IN (SELECT t.id FROM durable_timer AS t WHERE t.run_id = (SELECT run_id FROM fence) AND t.status = (SELECT 'pending') FOR UPDATE SKIP LOCKED)
    RETURNING 1
),
picked AS (SELECT "durable_work_item"."id" AS "id" FROM "durable_work_item" WHERE ("durable_work_item"."available_at" <= (STATEMENT_TIMESTAMP()) AND "durable_work_item"."status" = ('pending') AND NOT ("durable_work_item"."queue" IN (SELECT name FROM durable_queue_control WHERE paused)) AND (("durable_work_item"."queue" <> %s OR ((SELECT COUNT(*) FROM "durable_work_item" AS "running" WHERE "running"."status" = 'processing' AND "running"."queue" = %s AND "running"."id" <> %s) < %s AND ("durable_work_item"."concurrency_key" = '' OR (SELECT COUNT(*) FROM "durable_work_item" AS "running" WHERE "running"."status" = 'processing' AND "running"."queue" = %s AND "running"."id" <> %s AND "running"."concurrency_key" = "durable_work_item"."concurrency_key") < %s) AND NOT EXISTS (SELECT 1 FROM "durable_queue" AS "rated" WHERE "rated"."name" = %s AND "rated"."next_claim_at" > statement_timestamp()))))) ORDER BY "durable_work_item"."priority" DESC, "durable_work_item"."available_at" ASC, 1 ASC LIMIT 1 FOR NO KEY UPDATE SKIP LOCKED),
claimed AS (
    UPDATE durable_work_item AS w
    SET status = 'processing',
        claim_token = %s,
        claimed_by = %s,
        claim_expires_at = statement_timestamp() + make_interval(secs => %s),
        attempts = w.attempts + 1,
        wake = w.xmin <> (SELECT s.xmin FROM durable_work_item AS s WHERE s.id = w.id)
    WHERE w.id = (SELECT id FROM picked) AND NOT COALESCE(w.run_id = (SELECT run_id FROM fence), false) AND NOT COALESCE(w.run_id = (SELECT parent_id FROM done) AND w.kind = 'advance', false)
    RETURNING w.id, w.kind, w.run_id, w.step_key, w.attempts, w.function, w.input, w.group, w.queue, w.claimed_by,
              w.priority, w.available_at
),
run AS (
    -- Advancing makes the run `running`; a branch (a step item) leaves it waiting.
    UPDATE durable_workflow_run AS r
    SET status = 'running',
        started_at = COALESCE(r.started_at, statement_timestamp()),
        updated_at = statement_timestamp(),
        waiting_on = '',
        last_worker = claimed.claimed_by,
        last_claimed_at = statement_timestamp()
    FROM claimed
    WHERE r.id = (SELECT run_id FROM claimed WHERE kind = 'advance') AND r.status NOT IN ('cancelled', 'compensation_failed', 'completed', 'failed', 'timed_out')
    RETURNING r.id
),
rated AS (
    INSERT INTO durable_queue (name, next_claim_at)
    SELECT claimed.queue, statement_timestamp() + make_interval(secs => r.every)
    FROM claimed JOIN unnest(%s::varchar[], %s::float8[]) AS r (name, every) ON r.name = claimed.queue
    ON CONFLICT (name) DO UPDATE SET next_claim_at = EXCLUDED.next_claim_at
    RETURNING 1
)
SELECT (SELECT count(*) FROM fence), (SELECT status FROM done), (SELECT pg_notify('durable_work', '') FROM parent LIMIT 1), (SELECT pg_notify('durable_done', id::text) FROM done WHERE awaited), nxt.*
FROM (SELECT 1) AS one LEFT JOIN (
SELECT c.id, c.kind, c.run_id, c.step_key, c.attempts, statement_timestamp() AS db_now,
       CASE WHEN r.status NOT IN ('cancelled', 'compensation_failed', 'completed', 'failed', 'timed_out') THEN r.workflow END,
       r.input, r.attempt, r.max_attempts, r.deadline_at, r.cancel_requested_at IS NOT NULL,
       CASE WHEN c.kind = 'advance' THEN
           (SELECT json_agg(json_build_array(s.key, s.seq, s.kind, s.name, s.status, s.result, s.error, s.attempts, s.deadline_at, s.retry_at, s.match, s.fingerprint)) FROM durable_step AS s WHERE s.run_id = c.run_id)
       ELSE
           (SELECT json_agg(json_build_array(s.key, s.seq, s.kind, s.name, s.status, s.result, s.error, s.attempts, s.deadline_at, s.retry_at, s.match, s.fingerprint)) FROM durable_step AS s WHERE s.run_id = c.run_id AND s.key = c.step_key)
       END AS journal,
       CASE WHEN c.kind = 'advance' THEN
           (SELECT json_agg(json_build_array(m.id, m.kind, m.name, m.target_key, m.payload, m.created_at) ORDER BY m.id)
            FROM durable_signal AS m WHERE m.run_id = c.run_id AND m.consumed_at IS NULL) END AS messages,
       (SELECT json_agg(json_build_array(k.id, k.status, k.result, k.error))
        FROM durable_workflow_run AS k
        WHERE c.kind = 'advance' AND k.parent_id = c.run_id AND k.status IN ('cancelled', 'compensation_failed', 'completed', 'failed', 'timed_out')) AS children,
       c.function, c.input AS item_input, c.group, c.priority, c.available_at
FROM claimed AS c LEFT JOIN durable_workflow_run AS r ON r.id = c.run_id) AS nxt ON true;

-- name: start a run (7 parameters)
WITH run AS (
    INSERT INTO durable_workflow_run (id, workflow, status, waiting_on, input, attempt, max_attempts, queue, priority,
                                      concurrency_key, idempotency_key, scheduled_at, detached)
    VALUES (%s, %s, 'pending', '', %s, 1, %s, %s, %s, %s, NULL, NULL, false)
    RETURNING id, queue, priority, concurrency_key, created_at, updated_at
),
item AS (
    INSERT INTO durable_work_item (kind, run_id, step_key, "group", function, queue, priority, concurrency_key,
                                   status, available_at, attempts, wake, claimed_by, last_error)
    SELECT 'advance', run.id, '', '', '', run.queue, run.priority, run.concurrency_key, 'pending', statement_timestamp(), 0,
           false, '', ''
    FROM run
    RETURNING 1
)
SELECT count(*), max(created_at),
       CASE WHEN EXISTS (
            SELECT 1 FROM durable_work_item AS w
            WHERE w.status = 'pending' AND w.queue = (SELECT queue FROM run LIMIT 1) AND w.available_at <= statement_timestamp())
       THEN true ELSE (SELECT false FROM pg_notify('durable_work', '')) END FROM run;

-- name: start a run just after one that saw a ready item waiting (7 parameters)
WITH run AS (
    INSERT INTO durable_workflow_run (id, workflow, status, waiting_on, input, attempt, max_attempts, queue, priority,
                                      concurrency_key, idempotency_key, scheduled_at, detached)
    VALUES (%s, %s, 'pending', '', %s, 1, %s, %s, %s, %s, NULL, NULL, false)
    RETURNING id, queue, priority, concurrency_key, created_at, updated_at
),
item AS (
    INSERT INTO durable_work_item (kind, run_id, step_key, "group", function, queue, priority, concurrency_key,
                                   status, available_at, attempts, wake, claimed_by, last_error)
    SELECT 'advance', run.id, '', '', '', run.queue, run.priority, run.concurrency_key, 'pending', statement_timestamp(), 0,
           false, '', ''
    FROM run
    RETURNING 1
)
SELECT count(*), max(created_at) FROM run;

-- name: start many runs (9 parameters)
WITH run AS (
    INSERT INTO durable_workflow_run (id, workflow, status, waiting_on, input, attempt, max_attempts, queue, priority,
                                      concurrency_key, idempotency_key, scheduled_at, detached)
    SELECT given.id, given.workflow, 'pending', '', given.input, 1, given.max_attempts, given.queue,
           given.priority, given.concurrency_key, given.idempotency_key, given.scheduled_at, false
    FROM unnest(%s::uuid[], %s::varchar[], %s::integer[], %s::varchar[], %s::integer[], %s::varchar[],
                %s::varchar[], %s::timestamptz[],
                ARRAY(SELECT e.value FROM json_array_elements_text(%s::json) WITH ORDINALITY AS e (value, n)
                      ORDER BY e.n))
         AS given (id, workflow, max_attempts, queue, priority, concurrency_key, idempotency_key, scheduled_at, input)
    RETURNING id, queue, priority, concurrency_key, created_at, updated_at
),
item AS (
    INSERT INTO durable_work_item (kind, run_id, step_key, "group", function, queue, priority, concurrency_key,
                                   status, available_at, attempts, wake, claimed_by, last_error)
    SELECT 'advance', run.id, '', '', '', run.queue, run.priority, run.concurrency_key, 'pending', statement_timestamp(), 0,
           false, '', ''
    FROM run
    RETURNING 1
)
SELECT count(*), max(created_at), pg_notify('durable_work', '') FROM run;

-- name: start a schedule's fire times, each once (9 parameters)
WITH run AS (
    INSERT INTO durable_workflow_run (id, workflow, status, waiting_on, input, attempt, max_attempts, queue, priority,
                                      concurrency_key, idempotency_key, scheduled_at, detached)
    SELECT given.id, given.workflow, 'pending', '', given.input, 1, given.max_attempts, given.queue,
           given.priority, given.concurrency_key, given.idempotency_key, given.scheduled_at, false
    FROM unnest(%s::uuid[], %s::varchar[], %s::integer[], %s::varchar[], %s::integer[], %s::varchar[],
                %s::varchar[], %s::timestamptz[],
                ARRAY(SELECT e.value FROM json_array_elements_text(%s::json) WITH ORDINALITY AS e (value, n)
                      ORDER BY e.n))
         AS given (id, workflow, max_attempts, queue, priority, concurrency_key, idempotency_key, scheduled_at, input)
    ON CONFLICT DO NOTHING
    RETURNING id, queue, priority, concurrency_key, created_at, updated_at
),
item AS (
    INSERT INTO durable_work_item (kind, run_id, step_key, "group", function, queue, priority, concurrency_key,
                                   status, available_at, attempts, wake, claimed_by, last_error)
    SELECT 'advance', run.id, '', '', '', run.queue, run.priority, run.concurrency_key, 'pending', statement_timestamp(), 0,
           false, '', ''
    FROM run
    RETURNING 1
)
SELECT count(*), max(created_at) FROM run;

-- name: start a run in a fair queue (12 parameters)
WITH fair AS (
    SELECT %s::varchar AS queue, %s::varchar AS key, %s::integer AS n, %s::integer AS w,
           COALESCE((SELECT h.available_at FROM durable_work_item AS h
                     WHERE h.status = 'pending' AND h.queue = %s AND h.available_at <= statement_timestamp()
                     ORDER BY h.priority DESC, h.available_at, h.id LIMIT 1), statement_timestamp()) AS clock
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
),
run AS (
    INSERT INTO durable_workflow_run (id, workflow, status, waiting_on, input, attempt, max_attempts, queue, priority,
                                      concurrency_key, idempotency_key, scheduled_at, detached)
    VALUES (%s, %s, 'pending', '', %s, 1, %s, %s, %s, %s, NULL, NULL, false)
    RETURNING id, queue, priority, concurrency_key, created_at, updated_at
),
item AS (
    INSERT INTO durable_work_item (kind, run_id, step_key, "group", function, queue, priority, concurrency_key,
                                   status, available_at, attempts, wake, claimed_by, last_error, turn)
    SELECT 'advance', run.id, '', '', '', run.queue, run.priority, run.concurrency_key, 'pending', (SELECT turn FROM turn), 0,
           false, '', '', (SELECT turn FROM turn)
    FROM run
    RETURNING 1
)
SELECT count(*), max(created_at),
       CASE WHEN EXISTS (
            SELECT 1 FROM durable_work_item AS w
            WHERE w.status = 'pending' AND w.queue = (SELECT queue FROM run LIMIT 1) AND w.available_at <= statement_timestamp())
       THEN true ELSE (SELECT false FROM pg_notify('durable_work', '')) END FROM run;

-- name: start many runs in a fair queue, statement 1 of 2 (5 parameters)
WITH fair AS (
    SELECT %s::varchar AS queue, %s::varchar AS key, %s::integer AS n, %s::integer AS w,
           COALESCE((SELECT h.available_at FROM durable_work_item AS h
                     WHERE h.status = 'pending' AND h.queue = %s AND h.available_at <= statement_timestamp()
                     ORDER BY h.priority DESC, h.available_at, h.id LIMIT 1), statement_timestamp()) AS clock
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
)
SELECT turn, used FROM turn;

-- name: start many runs in a fair queue, statement 2 of 2 (11 parameters)
WITH run AS (
    INSERT INTO durable_workflow_run (id, workflow, status, waiting_on, input, attempt, max_attempts, queue, priority,
                                      concurrency_key, idempotency_key, scheduled_at, detached)
    SELECT given.id, given.workflow, 'pending', '', given.input, 1, given.max_attempts, given.queue,
           given.priority, given.concurrency_key, given.idempotency_key, given.scheduled_at, false
    FROM unnest(%s::uuid[], %s::varchar[], %s::integer[], %s::varchar[], %s::integer[], %s::varchar[],
                %s::varchar[], %s::timestamptz[],
                ARRAY(SELECT e.value FROM json_array_elements_text(%s::json) WITH ORDINALITY AS e (value, n)
                      ORDER BY e.n))
         AS given (id, workflow, max_attempts, queue, priority, concurrency_key, idempotency_key, scheduled_at, input)
    RETURNING id, queue, priority, concurrency_key, created_at, updated_at
),
item AS (
    INSERT INTO durable_work_item (kind, run_id, step_key, "group", function, queue, priority, concurrency_key,
                                   status, available_at, attempts, wake, claimed_by, last_error, turn)
    SELECT 'advance', run.id, '', '', '', run.queue, run.priority, run.concurrency_key, 'pending', COALESCE(f.turn, statement_timestamp()), 0,
           false, '', '', f.turn
    FROM run LEFT JOIN unnest(%s::uuid[], %s::timestamptz[]) AS f (id, turn) ON f.id = run.id
    RETURNING 1
)
SELECT count(*), max(created_at), pg_notify('durable_work', '') FROM run;

-- name: claim several items (a batch), statement 1 of 2 (0 parameters)
SET LOCAL enable_seqscan TO off;

-- name: claim several items (a batch), statement 2 of 2 (3 parameters)
WITH picked AS (
    SELECT p.id, row_number() OVER () AS n FROM (SELECT "durable_work_item"."id" AS "id" FROM "durable_work_item" WHERE ("durable_work_item"."available_at" <= (STATEMENT_TIMESTAMP()) AND "durable_work_item"."status" = ('pending') AND NOT ("durable_work_item"."queue" IN (SELECT name FROM durable_queue_control WHERE paused))) ORDER BY "durable_work_item"."priority" DESC, "durable_work_item"."available_at" ASC, 1 ASC LIMIT 2 FOR NO KEY UPDATE SKIP LOCKED) AS p
),
claimed AS (
    UPDATE durable_work_item AS w
    SET status = 'processing',
        claim_token = (%s::uuid[])[picked.n],
        claimed_by = %s,
        claim_expires_at = statement_timestamp() + make_interval(secs => %s),
        attempts = w.attempts + 1,
        wake = w.xmin <> (SELECT s.xmin FROM durable_work_item AS s WHERE s.id = w.id)
    FROM picked
    WHERE w.id = picked.id
    RETURNING w.id, w.kind, w.run_id, w.step_key, w.attempts, w.function, w.input, w.group, w.queue, w.claimed_by,
              w.priority, w.available_at, w.claim_token, picked.n
)

SELECT c.id, c.kind, c.run_id, c.step_key, c.attempts, statement_timestamp() AS db_now,
       CASE WHEN r.status NOT IN ('cancelled', 'compensation_failed', 'completed', 'failed', 'timed_out') THEN r.workflow END,
       r.input, r.attempt, r.max_attempts, r.deadline_at, r.cancel_requested_at IS NOT NULL,
       CASE WHEN c.kind = 'advance' THEN
           (SELECT json_agg(json_build_array(s.key, s.seq, s.kind, s.name, s.status, s.result, s.error, s.attempts, s.deadline_at, s.retry_at, s.match, s.fingerprint)) FROM durable_step AS s WHERE s.run_id = c.run_id)
       ELSE
           (SELECT json_agg(json_build_array(s.key, s.seq, s.kind, s.name, s.status, s.result, s.error, s.attempts, s.deadline_at, s.retry_at, s.match, s.fingerprint)) FROM durable_step AS s WHERE s.run_id = c.run_id AND s.key = c.step_key)
       END AS journal,
       CASE WHEN c.kind = 'advance' THEN
           (SELECT json_agg(json_build_array(m.id, m.kind, m.name, m.target_key, m.payload, m.created_at) ORDER BY m.id)
            FROM durable_signal AS m WHERE m.run_id = c.run_id AND m.consumed_at IS NULL) END AS messages,
       (SELECT json_agg(json_build_array(k.id, k.status, k.result, k.error))
        FROM durable_workflow_run AS k
        WHERE c.kind = 'advance' AND k.parent_id = c.run_id AND k.status IN ('cancelled', 'compensation_failed', 'completed', 'failed', 'timed_out')) AS children,
       c.function, c.input AS item_input, c.group, c.priority, c.available_at, c.claim_token, c.n
FROM claimed AS c LEFT JOIN durable_workflow_run AS r ON r.id = c.run_id;

-- name: claim several items from the claimer's floor, statement 1 of 3 (0 parameters)
SET LOCAL enable_seqscan TO off;

-- name: claim several items from the claimer's floor, statement 2 of 3 (0 parameters)
SET LOCAL enable_bitmapscan TO off;

-- name: claim several items from the claimer's floor, statement 3 of 3 (7 parameters)
WITH picked AS (
    SELECT p.id, row_number() OVER () AS n FROM (WITH floor_above AS (SELECT "durable_work_item"."id" AS "id", "durable_work_item"."priority" AS "priority", "durable_work_item"."available_at" AS "available_at" FROM "durable_work_item" WHERE ("durable_work_item"."available_at" <= (STATEMENT_TIMESTAMP()) AND "durable_work_item"."status" = ('pending') AND NOT ("durable_work_item"."queue" IN (SELECT name FROM durable_queue_control WHERE paused)) AND ("durable_work_item"."priority" > %s)) ORDER BY 2 DESC, 3 ASC, 1 ASC LIMIT 2 FOR NO KEY UPDATE SKIP LOCKED), floor_from AS (SELECT "durable_work_item"."id" AS "id", "durable_work_item"."priority" AS "priority", "durable_work_item"."available_at" AS "available_at" FROM "durable_work_item" WHERE ("durable_work_item"."available_at" <= (STATEMENT_TIMESTAMP()) AND "durable_work_item"."status" = ('pending') AND NOT ("durable_work_item"."queue" IN (SELECT name FROM durable_queue_control WHERE paused)) AND ("durable_work_item"."priority" = %s AND ("durable_work_item"."available_at", "durable_work_item"."id") >= (%s, %s))) ORDER BY 2 DESC, 3 ASC, 1 ASC LIMIT 2 FOR NO KEY UPDATE SKIP LOCKED) SELECT p.id FROM (SELECT * FROM floor_above UNION ALL SELECT * FROM floor_from) AS p ORDER BY p.priority DESC, p.available_at, p.id LIMIT 2) AS p
),
claimed AS (
    UPDATE durable_work_item AS w
    SET status = 'processing',
        claim_token = (%s::uuid[])[picked.n],
        claimed_by = %s,
        claim_expires_at = statement_timestamp() + make_interval(secs => %s),
        attempts = w.attempts + 1,
        wake = w.xmin <> (SELECT s.xmin FROM durable_work_item AS s WHERE s.id = w.id)
    FROM picked
    WHERE w.id = picked.id
    RETURNING w.id, w.kind, w.run_id, w.step_key, w.attempts, w.function, w.input, w.group, w.queue, w.claimed_by,
              w.priority, w.available_at, w.claim_token, picked.n
)

SELECT c.id, c.kind, c.run_id, c.step_key, c.attempts, statement_timestamp() AS db_now,
       CASE WHEN r.status NOT IN ('cancelled', 'compensation_failed', 'completed', 'failed', 'timed_out') THEN r.workflow END,
       r.input, r.attempt, r.max_attempts, r.deadline_at, r.cancel_requested_at IS NOT NULL,
       CASE WHEN c.kind = 'advance' THEN
           (SELECT json_agg(json_build_array(s.key, s.seq, s.kind, s.name, s.status, s.result, s.error, s.attempts, s.deadline_at, s.retry_at, s.match, s.fingerprint)) FROM durable_step AS s WHERE s.run_id = c.run_id)
       ELSE
           (SELECT json_agg(json_build_array(s.key, s.seq, s.kind, s.name, s.status, s.result, s.error, s.attempts, s.deadline_at, s.retry_at, s.match, s.fingerprint)) FROM durable_step AS s WHERE s.run_id = c.run_id AND s.key = c.step_key)
       END AS journal,
       CASE WHEN c.kind = 'advance' THEN
           (SELECT json_agg(json_build_array(m.id, m.kind, m.name, m.target_key, m.payload, m.created_at) ORDER BY m.id)
            FROM durable_signal AS m WHERE m.run_id = c.run_id AND m.consumed_at IS NULL) END AS messages,
       (SELECT json_agg(json_build_array(k.id, k.status, k.result, k.error))
        FROM durable_workflow_run AS k
        WHERE c.kind = 'advance' AND k.parent_id = c.run_id AND k.status IN ('cancelled', 'compensation_failed', 'completed', 'failed', 'timed_out')) AS children,
       c.function, c.input AS item_input, c.group, c.priority, c.available_at, c.claim_token, c.n
FROM claimed AS c LEFT JOIN durable_workflow_run AS r ON r.id = c.run_id;

-- name: finish several runs (a batch), with their last journal entries and a signal consumed, statement 1 of 2 (0 parameters)
SET LOCAL enable_seqscan TO off;

-- name: finish several runs (a batch), with their last journal entries and a signal consumed, statement 2 of 2 (41 parameters)
WITH ending AS (
    SELECT * FROM unnest(%s::bigint[], %s::uuid[], %s::uuid[], %s::text[], %s::timestamptz[], %s::varchar[])
        AS e (item_id, token, run_id, result, claimed_at, worker)
),
fence AS (
    DELETE FROM durable_work_item AS w
    USING ending AS e
    WHERE w.id = ANY(ARRAY(SELECT item_id FROM ending)) AND e.item_id = w.id AND w.claim_token = e.token
    RETURNING w.id, w.run_id
),
consumed AS (
    UPDATE durable_signal AS m SET consumed_at = statement_timestamp(), consumed_by = c.key
    FROM (VALUES (%s::bigint, %s::varchar, %s::uuid)) AS c (id, key, run_id)
    WHERE m.id = c.id AND m.consumed_at IS NULL AND c.run_id = ANY(ARRAY(SELECT run_id FROM fence))
    RETURNING 1
),
steps AS (
    INSERT INTO durable_step ("run_id", "key", "seq", "kind", "name", "status", "result", "error", "attempts", "started_at", "finished_at", "deadline_at", "retry_at", "match", "remaining", "fingerprint")
    SELECT v.* FROM (VALUES (%s::uuid, %s::varchar, %s::integer, %s::varchar, %s::varchar, %s::varchar, %s::text, %s::text, %s::integer, %s::timestamptz, %s::timestamptz, %s::timestamptz, %s::timestamptz, %s::text, %s::integer, %s::varchar), (%s::uuid, %s::varchar, %s::integer, %s::varchar, %s::varchar, %s::varchar, %s::text, %s::text, %s::integer, %s::timestamptz, %s::timestamptz, %s::timestamptz, %s::timestamptz, %s::text, %s::integer, %s::varchar)) AS v ("run_id", "key", "seq", "kind", "name", "status", "result", "error", "attempts", "started_at", "finished_at", "deadline_at", "retry_at", "match", "remaining", "fingerprint")
    WHERE v.run_id = ANY(ARRAY(SELECT run_id FROM fence))
    ON CONFLICT (run_id, key) DO UPDATE SET "kind" = EXCLUDED."kind", "name" = EXCLUDED."name", "status" = EXCLUDED."status", "result" = EXCLUDED."result", "error" = EXCLUDED."error", "attempts" = EXCLUDED."attempts", "started_at" = CASE WHEN durable_step.status = 'waiting' THEN durable_step.started_at ELSE EXCLUDED.started_at END, "finished_at" = EXCLUDED."finished_at", "deadline_at" = EXCLUDED."deadline_at", "retry_at" = EXCLUDED."retry_at", "match" = EXCLUDED."match", "remaining" = COALESCE(EXCLUDED."remaining", durable_step."remaining"), "fingerprint" = COALESCE(EXCLUDED."fingerprint", durable_step."fingerprint") WHERE durable_step.status NOT IN ('completed', 'failed') RETURNING 1
),
done AS (
    UPDATE durable_workflow_run AS r
    SET status = CASE WHEN r.cancel_requested_at IS NULL THEN 'completed' ELSE 'cancelled' END,
        result = CASE WHEN r.cancel_requested_at IS NULL THEN e.result END,
        error = CASE WHEN r.cancel_requested_at IS NULL THEN NULL ELSE r.error END,
        waiting_on = '',
        finished_at = statement_timestamp(),
        updated_at = statement_timestamp(),
        started_at = COALESCE(r.started_at, e.claimed_at),
        last_worker = COALESCE(e.worker, r.last_worker),
        last_claimed_at = COALESCE(e.claimed_at, r.last_claimed_at)
    FROM ending AS e
    WHERE r.id = ANY(ARRAY(SELECT run_id FROM fence)) AND e.run_id = r.id AND r.status NOT IN ('cancelled', 'compensation_failed', 'completed', 'failed', 'timed_out')
    RETURNING r.id, r.status, r.parent_id, r.awaited
),
-- Each run's lookups by its id, one run at a time (LATERAL, kept apart by OFFSET 0): an equality
-- the planner takes through the index, as FINISH_RUN's; `= ANY` of all the runs, or the lateral
-- merged into a join, it planned as a walk of every pending item.
unneeded AS (
    UPDATE durable_work_item AS o SET status = 'cancelled'
    WHERE o.id = ANY(ARRAY(
        SELECT b.id FROM fence AS f, LATERAL (
            SELECT x.id FROM durable_work_item AS x WHERE x.run_id = f.run_id AND x.kind = 'step' AND x.status = (SELECT 'pending') OFFSET 0) AS b))
    RETURNING 1
),
parent AS (
    UPDATE durable_work_item AS a
    SET status = CASE WHEN a.status = 'completed' THEN 'pending' ELSE a.status END,
        available_at = CASE WHEN a.status = 'completed' THEN COALESCE(a.turn, statement_timestamp()) ELSE a.available_at END,
        wake = CASE WHEN a.status = 'processing' THEN true ELSE a.wake END
    WHERE a.run_id = ANY(ARRAY(SELECT parent_id FROM done WHERE parent_id IS NOT NULL)) AND a.kind = 'advance'
    RETURNING 1
),
quiet AS (
    UPDATE durable_timer SET status = 'cancelled'
    WHERE id = ANY(ARRAY(
        SELECT q.id FROM fence AS f, LATERAL (SELECT t.id FROM durable_timer AS t WHERE t.run_id = f.run_id AND t.status = (SELECT 'pending') FOR UPDATE SKIP LOCKED) AS q))
    RETURNING 1
)
SELECT (SELECT json_agg(json_build_array(f.id, d.status)) FROM fence AS f LEFT JOIN done AS d ON d.id = f.run_id),
       (SELECT pg_notify('durable_work', '') FROM parent LIMIT 1),
       (SELECT count(pg_notify('durable_done', id::text)) FROM done WHERE awaited);
