-- Shared named queries (both dialects). Parameters are :name; PostgreSQL gets %(name)s.

-- name: project_insert
INSERT INTO projects (id, name, version, created_at_ms) VALUES (:id, :name, 1, :now)
ON CONFLICT DO NOTHING

-- name: project_get
SELECT id, name, version, created_at_ms FROM projects WHERE id = :ref OR name = :ref

-- name: project_list
SELECT id, name, version, created_at_ms FROM projects WHERE name > :after ORDER BY name LIMIT :limit

-- name: project_bump_version
UPDATE projects SET version = version + 1 WHERE id = :id

-- name: principal_insert
INSERT INTO principals (id, name, kind, is_owner, token_digest, created_at_ms, token_issued_at_ms, expires_at_ms)
VALUES (:id, :name, :kind, :is_owner, :token_digest, :now, :now, :expires_at_ms)

-- name: principal_by_digest
SELECT id, name, kind, is_owner, token_digest, created_at_ms, expires_at_ms, last_used_at_ms FROM principals
WHERE token_digest = :token_digest AND disabled_at_ms IS NULL

-- name: principal_count_owners
SELECT count(*) AS n FROM principals WHERE is_owner = 1

-- name: binding_upsert
INSERT INTO role_bindings (principal_id, project_id, role, version) VALUES (:principal_id, :project_id, :role, 1)
ON CONFLICT (principal_id, project_id) DO UPDATE SET role = excluded.role, version = role_bindings.version + 1

-- name: binding_get
SELECT principal_id, project_id, role, version FROM role_bindings
WHERE principal_id = :principal_id AND project_id = :project_id

-- name: task_insert
INSERT INTO tasks (id, project_id, name, enabled, revision, created_at_ms, updated_at_ms)
VALUES (:id, :project_id, :name, :enabled, 1, :now, :now)
ON CONFLICT DO NOTHING

-- name: task_revision_insert
INSERT INTO task_revisions (task_id, revision, spec_json, content_digest, created_at_ms)
VALUES (:task_id, :revision, :spec_json, :content_digest, :now)

-- name: task_get_by_id
SELECT id, project_id, name, enabled, revision, created_at_ms, updated_at_ms FROM tasks
WHERE project_id = :project_id AND id = :ref AND deleted_at_ms IS NULL

-- name: task_get_by_name
SELECT id, project_id, name, enabled, revision, created_at_ms, updated_at_ms FROM tasks
WHERE project_id = :project_id AND name = :ref AND deleted_at_ms IS NULL

-- name: task_list
SELECT id, project_id, name, enabled, revision, created_at_ms, updated_at_ms FROM tasks
WHERE project_id = :project_id AND deleted_at_ms IS NULL AND name > :after ORDER BY name LIMIT :limit

-- name: task_update
UPDATE tasks SET enabled = :enabled, revision = :revision, updated_at_ms = :now
WHERE id = :id AND revision = :expected_revision AND enabled = :expected_enabled AND deleted_at_ms IS NULL

-- name: task_delete
UPDATE tasks SET deleted_at_ms = :now, updated_at_ms = :now WHERE id = :id AND deleted_at_ms IS NULL

-- name: task_revision_get
SELECT task_id, revision, spec_json, content_digest, created_at_ms FROM task_revisions
WHERE task_id = :task_id AND revision = :revision

-- name: run_insert
INSERT INTO runs (id, project_id, task_id, task_revision, trigger_type, trigger_id, status, version, event_sequence,
  priority, idempotency_key, request_id, retry_of_run_id, scheduled_for_ms, created_at_ms, queued_at_ms,
  updated_at_ms)
VALUES (:id, :project_id, :task_id, :task_revision, :trigger_type, :trigger_id, :status, 0, 2, :priority,
  :idempotency_key, :request_id, :retry_of_run_id, :scheduled_for_ms, :now, :queued_at_ms, :now)
ON CONFLICT DO NOTHING

-- name: run_get
SELECT * FROM runs WHERE id = :id

-- name: run_get_in_project
SELECT * FROM runs WHERE id = :id AND project_id = :project_id

-- name: run_by_idempotency
SELECT * FROM runs WHERE project_id = :project_id AND idempotency_key = :idempotency_key

-- name: run_cas
UPDATE runs SET status = :status, version = version + 1, event_sequence = :event_sequence,
  queued_at_ms = :queued_at_ms, started_at_ms = :started_at_ms, finished_at_ms = :finished_at_ms,
  cancel_requested_at_ms = :cancel_requested_at_ms, cancel_reason = :cancel_reason, error_code = :error_code,
  exit_code = :exit_code, updated_at_ms = :now
WHERE id = :id AND version = :expected_version

-- name: run_list_first
SELECT * FROM runs WHERE project_id = :project_id
ORDER BY created_at_ms DESC, id DESC LIMIT :limit

-- name: run_list_after
SELECT * FROM runs WHERE project_id = :project_id
  AND (created_at_ms < :cursor_ms OR (created_at_ms = :cursor_ms AND id < :cursor_id))
ORDER BY created_at_ms DESC, id DESC LIMIT :limit

-- name: run_list_task_first
SELECT * FROM runs WHERE project_id = :project_id AND task_id = :task_id
ORDER BY created_at_ms DESC, id DESC LIMIT :limit

-- name: run_list_task_after
SELECT * FROM runs WHERE project_id = :project_id AND task_id = :task_id
  AND (created_at_ms < :cursor_ms OR (created_at_ms = :cursor_ms AND id < :cursor_id))
ORDER BY created_at_ms DESC, id DESC LIMIT :limit

-- name: attempt_insert
INSERT INTO run_attempts (id, run_id, attempt, status, executor_type, created_at_ms, callback_sequence)
VALUES (:id, :run_id, :attempt, :status, :executor_type, :now, 0)

-- name: attempt_get
SELECT * FROM run_attempts WHERE id = :id

-- name: attempt_latest
SELECT * FROM run_attempts WHERE run_id = :run_id ORDER BY attempt DESC LIMIT 1

-- name: attempt_list
SELECT * FROM run_attempts WHERE run_id = :run_id ORDER BY attempt LIMIT 64

-- name: attempt_cas
UPDATE run_attempts SET status = :status, worker_id = :worker_id, pid = :pid, executor_handle = :executor_handle,
  log_artifact_id = :log_artifact_id, deadline_at_ms = :deadline_at_ms, callback_token_hash = :callback_token_hash,
  callback_sequence = :callback_sequence, started_at_ms = :started_at_ms, finished_at_ms = :finished_at_ms,
  exit_code = :exit_code, error_code = :error_code
WHERE id = :id AND status = :expected_status AND callback_sequence = :expected_callback_sequence

-- name: event_insert
INSERT INTO run_events (id, run_id, sequence, type, dedupe_key, actor_type, actor_id, attempt_id, payload_json,
  created_at_ms)
VALUES (:id, :run_id, :sequence, :type, :dedupe_key, :actor_type, :actor_id, :attempt_id, :payload_json, :now)

-- name: event_list
SELECT * FROM run_events WHERE run_id = :run_id AND sequence > :after ORDER BY sequence LIMIT :limit
