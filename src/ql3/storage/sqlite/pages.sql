-- dialect-only: a page of new runs written at once, each table from one JSON array (cron admission);
-- the same names on PostgreSQL read the array with jsonb_to_recordset.

-- name: run_insert_page
-- desc: Creates a page of queued Runs (one JSON array) at version 0; returns the ids inserted (a taken key: none).
INSERT INTO runs (id, project_id, task_id, task_revision, trigger_type, trigger_id, status, version, event_sequence,
  priority, idempotency_key, request_digest, request_id, retry_of_run_id, scheduled_for_ms, created_at_ms,
  queued_at_ms, updated_at_ms)
SELECT json_extract(value, '$.id'), json_extract(value, '$.project_id'), json_extract(value, '$.task_id'),
  json_extract(value, '$.task_revision'), json_extract(value, '$.trigger_type'), json_extract(value, '$.trigger_id'),
  'queued', 0, 2, json_extract(value, '$.priority'), json_extract(value, '$.idempotency_key'),
  json_extract(value, '$.request_digest'), json_extract(value, '$.request_id'),
  json_extract(value, '$.retry_of_run_id'), json_extract(value, '$.scheduled_for_ms'), :now, :now, :now
FROM json_each(:runs) WHERE true
ON CONFLICT DO NOTHING
RETURNING id

-- name: attempt_insert_page
-- desc: Creates the first Attempt of each run of a page (one JSON array of attempt and run ids), callback sequence 0.
INSERT INTO run_attempts (id, run_id, attempt, status, executor_type, created_at_ms, callback_sequence)
SELECT json_extract(value, '$.id'), json_extract(value, '$.run_id'), 1, :status, :executor_type, :now, 0
FROM json_each(:attempts)

-- name: event_insert_page
-- desc: Appends the events of a page of new runs (one JSON array, each with its run and sequence).
INSERT INTO run_events (id, run_id, sequence, type, dedupe_key, actor_type, actor_id, attempt_id, payload_json,
  created_at_ms)
SELECT json_extract(value, '$.id'), json_extract(value, '$.run_id'), json_extract(value, '$.sequence'),
  json_extract(value, '$.type'), json_extract(value, '$.dedupe_key'), json_extract(value, '$.actor_type'),
  json_extract(value, '$.actor_id'), json_extract(value, '$.attempt_id'), json_extract(value, '$.payload_json'), :now
FROM json_each(:events)

-- name: retry_policy_insert_page
-- desc: Stores the retry policies of a page of new runs (one JSON array), at version 0.
INSERT INTO run_retry_policies (run_id, max_attempts, retry_on_lost, safety, backoff_min_ms, backoff_max_ms, version)
SELECT json_extract(value, '$.run_id'), json_extract(value, '$.max_attempts'), json_extract(value, '$.retry_on_lost'),
  json_extract(value, '$.safety'), json_extract(value, '$.backoff_min_ms'), json_extract(value, '$.backoff_max_ms'), 0
FROM json_each(:policies)

-- name: task_active_page
-- desc: Which tasks of a page (one JSON array of ids) have a run that has not ended, for the overlap policy.
SELECT t.value AS task_id FROM json_each(:task_ids) AS t
WHERE EXISTS (SELECT 1 FROM runs r WHERE r.task_id = t.value
  AND r.status IN ('queued', 'dispatching', 'running', 'retry_wait', 'lost', 'waiting_approval'))
