-- dialect-only: a page of new runs written at once, each table from one JSON array (cron admission);
-- the same names on SQLite read the array with json_each.

-- name: run_insert_page
-- desc: Creates a page of queued Runs (one JSON array) at version 0; returns the ids inserted (a taken key: none).
INSERT INTO runs (id, project_id, task_id, task_revision, trigger_type, trigger_id, status, version, event_sequence,
  priority, idempotency_key, request_digest, request_id, retry_of_run_id, scheduled_for_ms, created_at_ms,
  queued_at_ms, updated_at_ms)
SELECT m.id, m.project_id, m.task_id, m.task_revision, m.trigger_type, m.trigger_id, 'queued', 0, 2, m.priority,
  m.idempotency_key, m.request_digest, m.request_id, m.retry_of_run_id, m.scheduled_for_ms, :now, :now, :now
FROM jsonb_to_recordset(CAST(:runs AS jsonb)) AS m(id text, project_id text, task_id text, task_revision integer,
  trigger_type text, trigger_id text, priority integer, idempotency_key text, request_digest text,
  request_id text, retry_of_run_id text, scheduled_for_ms bigint)
ON CONFLICT DO NOTHING
RETURNING id

-- name: attempt_insert_page
-- desc: Creates the first Attempt of each run of a page (one JSON array of attempt and run ids), callback sequence 0.
INSERT INTO run_attempts (id, run_id, attempt, status, executor_type, created_at_ms, callback_sequence)
SELECT m.id, m.run_id, 1, :status, :executor_type, :now, 0
FROM jsonb_to_recordset(CAST(:attempts AS jsonb)) AS m(id text, run_id text)

-- name: event_insert_page
-- desc: Appends the events of a page of new runs (one JSON array, each with its run and sequence).
INSERT INTO run_events (id, run_id, sequence, type, dedupe_key, actor_type, actor_id, attempt_id, payload_json,
  created_at_ms)
SELECT m.id, m.run_id, m.sequence, m.type, m.dedupe_key, m.actor_type, m.actor_id, m.attempt_id, m.payload_json, :now
FROM jsonb_to_recordset(CAST(:events AS jsonb)) AS m(id text, run_id text, sequence integer, type text,
  dedupe_key text, actor_type text, actor_id text, attempt_id text, payload_json text)

-- name: retry_policy_insert_page
-- desc: Stores the retry policies of a page of new runs (one JSON array), at version 0.
INSERT INTO run_retry_policies (run_id, max_attempts, retry_on_lost, safety, backoff_min_ms, backoff_max_ms, version)
SELECT m.run_id, m.max_attempts, m.retry_on_lost, m.safety, m.backoff_min_ms, m.backoff_max_ms, 0
FROM jsonb_to_recordset(CAST(:policies AS jsonb)) AS m(run_id text, max_attempts integer, retry_on_lost integer,
  safety text, backoff_min_ms bigint, backoff_max_ms bigint)

-- name: task_active_page
-- desc: Which tasks of a page (one JSON array of ids) have a run that has not ended, for the overlap policy.
SELECT t.task_id FROM jsonb_array_elements_text(CAST(:task_ids AS jsonb)) AS t(task_id)
WHERE EXISTS (SELECT 1 FROM runs r WHERE r.task_id = t.task_id
  AND r.status IN ('queued', 'dispatching', 'running', 'retry_wait', 'lost', 'waiting_approval'))

-- name: run_insert_page_all
-- desc: PostgreSQL: run_insert_page and its attempts, events and retry policies in one statement; the ids inserted.
WITH ins AS (
  INSERT INTO runs (id, project_id, task_id, task_revision, trigger_type, trigger_id, status, version,
    event_sequence, priority, idempotency_key, request_digest, request_id, retry_of_run_id, scheduled_for_ms,
    created_at_ms, queued_at_ms, updated_at_ms)
  SELECT m.id, m.project_id, m.task_id, m.task_revision, m.trigger_type, m.trigger_id, 'queued', 0, 2, m.priority,
    m.idempotency_key, m.request_digest, m.request_id, m.retry_of_run_id, m.scheduled_for_ms, :now, :now, :now
  FROM jsonb_to_recordset(CAST(:runs AS jsonb)) AS m(id text, project_id text, task_id text, task_revision integer,
    trigger_type text, trigger_id text, priority integer, idempotency_key text, request_digest text,
    request_id text, retry_of_run_id text, scheduled_for_ms bigint)
  ON CONFLICT DO NOTHING
  RETURNING id
), attempts AS (
  INSERT INTO run_attempts (id, run_id, attempt, status, executor_type, created_at_ms, callback_sequence)
  SELECT a.id, a.run_id, 1, :status, :executor_type, :now, 0
  FROM jsonb_to_recordset(CAST(:attempts AS jsonb)) AS a(id text, run_id text) JOIN ins ON ins.id = a.run_id
), events AS (
  INSERT INTO run_events (id, run_id, sequence, type, dedupe_key, actor_type, actor_id, attempt_id, payload_json,
    created_at_ms)
  SELECT e.id, e.run_id, e.sequence, e.type, e.dedupe_key, e.actor_type, e.actor_id, e.attempt_id, e.payload_json,
    :now
  FROM jsonb_to_recordset(CAST(:events AS jsonb)) AS e(id text, run_id text, sequence integer, type text,
    dedupe_key text, actor_type text, actor_id text, attempt_id text, payload_json text)
  JOIN ins ON ins.id = e.run_id
), policies AS (
  INSERT INTO run_retry_policies (run_id, max_attempts, retry_on_lost, safety, backoff_min_ms, backoff_max_ms,
    version)
  SELECT p.run_id, p.max_attempts, p.retry_on_lost, p.safety, p.backoff_min_ms, p.backoff_max_ms, 0
  FROM jsonb_to_recordset(CAST(:policies AS jsonb)) AS p(run_id text, max_attempts integer, retry_on_lost integer,
    safety text, backoff_min_ms bigint, backoff_max_ms bigint)
  JOIN ins ON ins.id = p.run_id
)
SELECT id FROM ins
