-- dialect-only: the locked reads, which have no shared text: a plain read here, SELECT ... FOR UPDATE on PostgreSQL.
-- Writers are serialised by BEGIN IMMEDIATE, so a plain read is a locked read.

-- name: run_lock
-- desc: One Run by id; a plain read is a locked read because BEGIN IMMEDIATE serialises writers.
SELECT * FROM runs WHERE id = :id

-- name: attempt_lock
-- desc: One Attempt by id; a plain read is a locked read because BEGIN IMMEDIATE serialises writers.
SELECT * FROM run_attempts WHERE id = :id

-- name: lease_lock
-- desc: An attempt's lease row; a plain read is a locked read because BEGIN IMMEDIATE serialises writers.
SELECT * FROM run_leases WHERE attempt_id = :attempt_id

-- name: worker_lock
-- desc: One worker row; a plain read is a locked read because BEGIN IMMEDIATE serialises writers.
SELECT * FROM workers WHERE worker_id = :worker_id

-- name: schedule_lock
-- desc: A task's schedule row; a plain read is a locked read because BEGIN IMMEDIATE serialises writers.
SELECT * FROM task_schedules WHERE task_id = :task_id

-- name: cancel_dispatch_lock
-- desc: A run's cancellation dispatch; a plain read is a locked read (writers are serialised).
SELECT * FROM cancellation_dispatches WHERE run_id = :run_id

-- name: approval_lock
-- desc: One approval request; a plain read is a locked read because BEGIN IMMEDIATE serialises writers.
SELECT * FROM approval_requests WHERE id = :id

-- name: aa_execution_lock
-- desc: An approved action's execution row; a plain read is a locked read (writers are serialised).
SELECT * FROM approved_action_executions WHERE dispatch_id = :dispatch_id

-- name: aa_recovery_lock
-- desc: An approved action's recovery control; a plain read is a locked read (writers are serialised).
SELECT * FROM approved_action_recovery WHERE dispatch_id = :dispatch_id

-- fence_lock: plain columns, each table's under its own prefix (r__, a__, l__, w__; NULL when the row is missing or not
-- asked for), read from one row that always exists: no JSON built in SQL and parsed again in Python.
-- name: fence_lock
-- desc: One statement: the Run and Attempt (given run_id), the lease, the worker, the pinned spec (with_revision).
SELECT
  r.id AS r__id, r.project_id AS r__project_id, r.task_id AS r__task_id, r.task_revision AS r__task_revision,
  r.trigger_type AS r__trigger_type, r.status AS r__status, r.version AS r__version,
  r.event_sequence AS r__event_sequence, r.priority AS r__priority, r.idempotency_key AS r__idempotency_key,
  r.request_id AS r__request_id, r.scheduled_for_ms AS r__scheduled_for_ms,
  r.created_at_ms AS r__created_at_ms, r.queued_at_ms AS r__queued_at_ms, r.started_at_ms AS r__started_at_ms,
  r.finished_at_ms AS r__finished_at_ms, r.cancel_requested_at_ms AS r__cancel_requested_at_ms,
  r.cancel_reason AS r__cancel_reason, r.error_code AS r__error_code, r.exit_code AS r__exit_code,
  a.id AS a__id, a.run_id AS a__run_id, a.attempt AS a__attempt, a.status AS a__status,
  a.executor_type AS a__executor_type, a.worker_id AS a__worker_id, a.pid AS a__pid,
  a.executor_handle AS a__executor_handle, a.log_artifact_id AS a__log_artifact_id,
  a.deadline_at_ms AS a__deadline_at_ms, a.callback_token_hash AS a__callback_token_hash,
  a.callback_sequence AS a__callback_sequence, a.created_at_ms AS a__created_at_ms,
  a.started_at_ms AS a__started_at_ms, a.finished_at_ms AS a__finished_at_ms, a.exit_code AS a__exit_code,
  a.error_code AS a__error_code,
  l.attempt_id AS l__attempt_id, l.run_id AS l__run_id, l.status AS l__status, l.version AS l__version,
  l.lease_generation AS l__lease_generation, l.worker_id AS l__worker_id,
  l.worker_session_id AS l__worker_session_id, l.worker_generation AS l__worker_generation,
  l.lease_token_digest AS l__lease_token_digest, l.acquired_at_ms AS l__acquired_at_ms,
  l.expires_at_ms AS l__expires_at_ms,
  w.worker_id AS w__worker_id, w.session_id AS w__session_id, w.generation AS w__generation,
  w.status AS w__status, w.version AS w__version, w.capabilities_json AS w__capabilities_json,
  w.capabilities_hash AS w__capabilities_hash, w.max_concurrent_runs AS w__max_concurrent_runs,
  w.active_leases AS w__active_leases, w.session_lease_ms AS w__session_lease_ms,
  w.last_heartbeat_at_ms AS w__last_heartbeat_at_ms, w.lease_expires_at_ms AS w__lease_expires_at_ms,
  v.spec_json AS revision_spec
FROM (SELECT 1) AS one_row
LEFT JOIN runs r ON r.id = :run_id
LEFT JOIN run_attempts a ON a.id = :attempt_id AND :run_id IS NOT NULL
LEFT JOIN run_leases l ON l.attempt_id = :attempt_id
LEFT JOIN workers w ON w.worker_id = :worker_id
LEFT JOIN task_revisions v ON :with_revision = 1 AND v.task_id = r.task_id AND v.revision = r.task_revision

-- name: schedule_lock_due_page
-- desc: A page of due schedules with their tasks' rows, earliest first (BEGIN IMMEDIATE serialises admitters).
SELECT s.*, t.name AS t__name, t.enabled AS t__enabled, t.revision AS t__revision, t.created_at_ms AS t__created_at_ms,
  t.updated_at_ms AS t__updated_at_ms, t.deleted_at_ms AS t__deleted_at_ms, t.project_id AS t__project_id,
  r.spec_json AS r__spec_json
FROM task_schedules s JOIN tasks t ON t.id = s.task_id
LEFT JOIN task_revisions r ON r.task_id = t.id AND r.revision = t.revision
WHERE s.next_fire_at_ms IS NOT NULL AND s.next_fire_at_ms <= :now
  AND NOT EXISTS (SELECT 1 FROM parked_items k WHERE k.item_kind = 'schedule' AND k.item_key = s.task_id
    AND k.next_retry_at_ms > :now)
ORDER BY s.next_fire_at_ms, s.task_id LIMIT :limit

-- name: schedule_move_page
-- desc: Moves a page of cron cursors at once (a JSON array of task id, revision, occurrence, due and last decided).
UPDATE task_schedules SET task_revision = m.task_revision, next_occurrence_ms = m.next_occurrence_ms,
  next_fire_at_ms = m.next_fire_at_ms, last_scheduled_at_ms = m.last_scheduled_at_ms,
  state_version = state_version + 1, updated_at_ms = :now
FROM (SELECT json_extract(value, '$.task_id') AS task_id, json_extract(value, '$.task_revision') AS task_revision,
    json_extract(value, '$.next_occurrence_ms') AS next_occurrence_ms,
    json_extract(value, '$.next_fire_at_ms') AS next_fire_at_ms,
    json_extract(value, '$.last_scheduled_at_ms') AS last_scheduled_at_ms
  FROM json_each(:moves)) AS m
WHERE task_schedules.task_id = m.task_id
