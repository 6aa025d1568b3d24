-- Runs filtered for the console and `ql3 run list`: newest first, keyset pages on (created_at_ms, id).
-- Every filter is optional (NULL means "any"); statuses are up to eleven slots (one per run status),
-- the trigger is the derived one: retry (a re-run of an earlier run), approval, cron or manual.

-- name: run_filter_page
-- desc: A page of a project's runs filtered by task, statuses, trigger and time, newest first, with task name.
SELECT r.*, t.name AS task_name,
  CASE WHEN r.retry_of_run_id IS NOT NULL THEN 'retry'
       WHEN r.trigger_type = 'approved_action' THEN 'approval'
       ELSE r.trigger_type END AS trigger_kind,
  (SELECT MAX(a.attempt) FROM run_attempts a WHERE a.run_id = r.id) AS attempt_count
FROM runs r JOIN tasks t ON t.id = r.task_id
WHERE r.project_id = :project_id
  AND (CAST(:task_id AS TEXT) IS NULL OR r.task_id = CAST(:task_id AS TEXT))
  AND (:any_status = 1 OR r.status IN (:s0, :s1, :s2, :s3, :s4, :s5, :s6, :s7, :s8, :s9, :s10))
  AND (CAST(:trigger AS TEXT) IS NULL OR CAST(:trigger AS TEXT) = CASE
       WHEN r.retry_of_run_id IS NOT NULL THEN 'retry'
       WHEN r.trigger_type = 'approved_action' THEN 'approval'
       ELSE r.trigger_type END)
  AND (CAST(:since_ms AS BIGINT) IS NULL OR r.created_at_ms >= CAST(:since_ms AS BIGINT))
  AND (CAST(:until_ms AS BIGINT) IS NULL OR r.created_at_ms < CAST(:until_ms AS BIGINT))
  AND (CAST(:cursor_ms AS BIGINT) IS NULL OR r.created_at_ms < CAST(:cursor_ms AS BIGINT)
       OR (r.created_at_ms = CAST(:cursor_ms AS BIGINT) AND r.id < CAST(:cursor_id AS TEXT)))
ORDER BY r.created_at_ms DESC, r.id DESC LIMIT :limit

-- name: run_filter_live_page
-- desc: run_filter_page when every status asked for is live: read through the partial index of live runs.
SELECT r.*, t.name AS task_name,
  CASE WHEN r.retry_of_run_id IS NOT NULL THEN 'retry'
       WHEN r.trigger_type = 'approved_action' THEN 'approval'
       ELSE r.trigger_type END AS trigger_kind,
  (SELECT MAX(a.attempt) FROM run_attempts a WHERE a.run_id = r.id) AS attempt_count
FROM runs r JOIN tasks t ON t.id = r.task_id
WHERE r.project_id = :project_id
  AND r.status IN ('created', 'queued', 'dispatching', 'running', 'waiting_approval', 'retry_wait', 'lost')
  AND (CAST(:task_id AS TEXT) IS NULL OR r.task_id = CAST(:task_id AS TEXT))
  AND (:any_status = 1 OR r.status IN (:s0, :s1, :s2, :s3, :s4, :s5, :s6, :s7, :s8, :s9, :s10))
  AND (CAST(:trigger AS TEXT) IS NULL OR CAST(:trigger AS TEXT) = CASE
       WHEN r.retry_of_run_id IS NOT NULL THEN 'retry'
       WHEN r.trigger_type = 'approved_action' THEN 'approval'
       ELSE r.trigger_type END)
  AND (CAST(:since_ms AS BIGINT) IS NULL OR r.created_at_ms >= CAST(:since_ms AS BIGINT))
  AND (CAST(:until_ms AS BIGINT) IS NULL OR r.created_at_ms < CAST(:until_ms AS BIGINT))
  AND (CAST(:cursor_ms AS BIGINT) IS NULL OR r.created_at_ms < CAST(:cursor_ms AS BIGINT)
       OR (r.created_at_ms = CAST(:cursor_ms AS BIGINT) AND r.id < CAST(:cursor_id AS TEXT)))
ORDER BY r.created_at_ms DESC, r.id DESC LIMIT :limit

-- name: run_filter_task_page
-- desc: run_filter_page for one task: read through the task's own runs index, not the project's whole history.
SELECT r.*, t.name AS task_name,
  CASE WHEN r.retry_of_run_id IS NOT NULL THEN 'retry'
       WHEN r.trigger_type = 'approved_action' THEN 'approval'
       ELSE r.trigger_type END AS trigger_kind,
  (SELECT MAX(a.attempt) FROM run_attempts a WHERE a.run_id = r.id) AS attempt_count
FROM runs r JOIN tasks t ON t.id = r.task_id
WHERE r.project_id = :project_id
  AND r.task_id = :task_id
  AND (:any_status = 1 OR r.status IN (:s0, :s1, :s2, :s3, :s4, :s5, :s6, :s7, :s8, :s9, :s10))
  AND (CAST(:trigger AS TEXT) IS NULL OR CAST(:trigger AS TEXT) = CASE
       WHEN r.retry_of_run_id IS NOT NULL THEN 'retry'
       WHEN r.trigger_type = 'approved_action' THEN 'approval'
       ELSE r.trigger_type END)
  AND (CAST(:since_ms AS BIGINT) IS NULL OR r.created_at_ms >= CAST(:since_ms AS BIGINT))
  AND (CAST(:until_ms AS BIGINT) IS NULL OR r.created_at_ms < CAST(:until_ms AS BIGINT))
  AND (CAST(:cursor_ms AS BIGINT) IS NULL OR r.created_at_ms < CAST(:cursor_ms AS BIGINT)
       OR (r.created_at_ms = CAST(:cursor_ms AS BIGINT) AND r.id < CAST(:cursor_id AS TEXT)))
ORDER BY r.created_at_ms DESC, r.id DESC LIMIT :limit

-- name: run_filter_extras
-- desc: A run's task name, derived trigger kind and attempt count, for one run shown like a filtered row.
SELECT t.name AS task_name,
  CASE WHEN r.retry_of_run_id IS NOT NULL THEN 'retry'
       WHEN r.trigger_type = 'approved_action' THEN 'approval'
       ELSE r.trigger_type END AS trigger_kind,
  (SELECT MAX(a.attempt) FROM run_attempts a WHERE a.run_id = r.id) AS attempt_count
FROM runs r JOIN tasks t ON t.id = r.task_id
WHERE r.id = :id

-- name: task_revision_list
-- desc: A task's revisions, newest first, for revision history.
SELECT task_id, revision, spec_json, content_digest, created_at_ms FROM task_revisions
WHERE task_id = :task_id ORDER BY revision DESC LIMIT :limit
