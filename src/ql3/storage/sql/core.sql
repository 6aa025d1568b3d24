-- Shared named queries (both dialects). Parameters are :name; PostgreSQL gets %(name)s.

-- name: project_insert
-- desc: Creates a project at version 1; no row when the id or name is taken, so the caller reads the existing one.
INSERT INTO projects (id, name, version, created_at_ms) VALUES (:id, :name, 1, :now)
ON CONFLICT DO NOTHING

-- name: project_get
-- desc: One project by id or by name, so the CLI and API can accept either reference.
SELECT id, name, version, created_at_ms FROM projects WHERE id = :ref OR name = :ref

-- name: project_list
-- desc: A keyset page of projects ordered by name, after the given name.
SELECT id, name, version, created_at_ms FROM projects WHERE name > :after ORDER BY name LIMIT :limit

-- name: project_bump_version
-- desc: Increments a project's version so cached views of its settings and bindings see a change.
UPDATE projects SET version = version + 1 WHERE id = :id

-- name: principal_insert
-- desc: Stores a new principal (user, owner or worker) with its token digest, issue time and expiry.
INSERT INTO principals (id, name, kind, is_owner, token_digest, created_at_ms, token_issued_at_ms, expires_at_ms,
  issued_by)
VALUES (:id, :name, :kind, :is_owner, :token_digest, :now, :now, :expires_at_ms, :issued_by)

-- name: principal_by_digest
-- desc: The enabled principal whose token digest matches: the bearer-token authentication lookup.
SELECT id, name, kind, is_owner, token_digest, created_at_ms, expires_at_ms, last_used_at_ms FROM principals
WHERE token_digest = :token_digest AND disabled_at_ms IS NULL

-- name: principal_count_owners
-- desc: How many owner principals exist, to decide whether the first-start owner must still be created.
SELECT count(*) AS n FROM principals WHERE is_owner = 1

-- name: binding_upsert
-- desc: Grants or changes a principal's role in a project, bumping the binding's version on change.
INSERT INTO role_bindings (principal_id, project_id, role, version) VALUES (:principal_id, :project_id, :role, 1)
ON CONFLICT (principal_id, project_id) DO UPDATE SET role = excluded.role, version = role_bindings.version + 1

-- name: binding_get
-- desc: A principal's role binding in one project, for the permission check.
SELECT principal_id, project_id, role, version FROM role_bindings
WHERE principal_id = :principal_id AND project_id = :project_id

-- name: task_insert
-- desc: Creates a task at revision 1; no row when the project already has the id or name.
INSERT INTO tasks (id, project_id, name, enabled, revision, created_at_ms, updated_at_ms)
VALUES (:id, :project_id, :name, :enabled, 1, :now, :now)
ON CONFLICT DO NOTHING

-- name: task_revision_insert
-- desc: Stores an immutable task revision: its normalised spec and content digest.
INSERT INTO task_revisions (task_id, revision, spec_json, content_digest, created_at_ms)
VALUES (:task_id, :revision, :spec_json, :content_digest, :now)

-- name: task_get_by_id
-- desc: A live (not deleted) task of a project by id.
SELECT id, project_id, name, enabled, revision, created_at_ms, updated_at_ms FROM tasks
WHERE project_id = :project_id AND id = :ref AND deleted_at_ms IS NULL

-- name: task_get_by_name
-- desc: A live (not deleted) task of a project by name.
SELECT id, project_id, name, enabled, revision, created_at_ms, updated_at_ms FROM tasks
WHERE project_id = :project_id AND name = :ref AND deleted_at_ms IS NULL

-- name: task_list
-- desc: A page of live tasks by name after a name, with revision and next fire; optionally searched.
SELECT t.id, t.project_id, t.name, t.enabled, t.revision, t.created_at_ms, t.updated_at_ms,
  r.spec_json, r.content_digest, r.created_at_ms AS revision_created_at_ms, s.next_fire_at_ms
FROM tasks t JOIN task_revisions r ON r.task_id = t.id AND r.revision = t.revision
LEFT JOIN task_schedules s ON s.task_id = t.id
WHERE t.project_id = :project_id AND t.deleted_at_ms IS NULL AND t.name > :after
  AND (CAST(:name_like AS TEXT) IS NULL OR LOWER(t.name) LIKE CAST(:name_like AS TEXT) ESCAPE '\'
       OR t.id LIKE CAST(:id_like AS TEXT) ESCAPE '\')
ORDER BY t.name LIMIT :limit

-- name: task_list_before
-- desc: The page of live tasks just before a name (last name first), with revision and next fire.
SELECT t.id, t.project_id, t.name, t.enabled, t.revision, t.created_at_ms, t.updated_at_ms,
  r.spec_json, r.content_digest, r.created_at_ms AS revision_created_at_ms, s.next_fire_at_ms
FROM tasks t JOIN task_revisions r ON r.task_id = t.id AND r.revision = t.revision
LEFT JOIN task_schedules s ON s.task_id = t.id
WHERE t.project_id = :project_id AND t.deleted_at_ms IS NULL AND t.name < :before
  AND (CAST(:name_like AS TEXT) IS NULL OR LOWER(t.name) LIKE CAST(:name_like AS TEXT) ESCAPE '\'
       OR t.id LIKE CAST(:id_like AS TEXT) ESCAPE '\')
ORDER BY t.name DESC LIMIT :limit

-- name: task_next_fires
-- desc: The project's enabled live tasks with the earliest next cron fire times (bounded, by the schedule index).
SELECT t.id, t.name, s.next_fire_at_ms FROM task_schedules s JOIN tasks t ON t.id = s.task_id
WHERE s.project_id = :project_id AND s.next_fire_at_ms IS NOT NULL AND t.enabled = 1 AND t.deleted_at_ms IS NULL
ORDER BY s.next_fire_at_ms, s.task_id LIMIT :limit

-- name: task_update
-- desc: Compare-and-set of a task's enabled flag and current revision; no row when it changed meanwhile.
UPDATE tasks SET enabled = :enabled, revision = :revision, updated_at_ms = :now
WHERE id = :id AND revision = :expected_revision AND enabled = :expected_enabled AND deleted_at_ms IS NULL

-- name: task_delete
-- desc: Soft-deletes a live task (sets deleted_at_ms) so its runs and revisions stay readable.
UPDATE tasks SET deleted_at_ms = :now, updated_at_ms = :now WHERE id = :id AND deleted_at_ms IS NULL

-- name: task_revision_get
-- desc: One revision of a task: the spec a run was pinned to.
SELECT task_id, revision, spec_json, content_digest, created_at_ms FROM task_revisions
WHERE task_id = :task_id AND revision = :revision

-- name: run_insert
-- desc: Creates a Run at version 0; no row on an id or idempotency-key conflict, so the caller returns the original.
INSERT INTO runs (id, project_id, task_id, task_revision, trigger_type, trigger_id, status, version, event_sequence,
  priority, idempotency_key, request_digest, request_id, retry_of_run_id, scheduled_for_ms, created_at_ms,
  queued_at_ms, updated_at_ms)
VALUES (:id, :project_id, :task_id, :task_revision, :trigger_type, :trigger_id, :status, 0, 2, :priority,
  :idempotency_key, :request_digest, :request_id, :retry_of_run_id, :scheduled_for_ms, :now, :queued_at_ms, :now)
ON CONFLICT DO NOTHING

-- name: run_get
-- desc: One Run by id, unlocked.
SELECT * FROM runs WHERE id = :id

-- name: run_get_in_project
-- desc: One Run by id only if it belongs to the project, so a caller cannot read another project's run.
SELECT * FROM runs WHERE id = :id AND project_id = :project_id

-- name: run_by_idempotency
-- desc: The project's Run created with the idempotency key, to answer a repeated create with the same run.
SELECT * FROM runs WHERE project_id = :project_id AND idempotency_key = :idempotency_key

-- name: run_cas
-- desc: Compare-and-set of a Run's status and timestamps on its version; no row when another writer moved it.
UPDATE runs SET status = :status, version = version + 1, event_sequence = :event_sequence,
  queued_at_ms = :queued_at_ms, started_at_ms = :started_at_ms, finished_at_ms = :finished_at_ms,
  cancel_requested_at_ms = :cancel_requested_at_ms, cancel_reason = :cancel_reason, error_code = :error_code,
  exit_code = :exit_code, updated_at_ms = :now
WHERE id = :id AND version = :expected_version

-- A change that moves nothing but the version and the event sequence (an event of the Run, as the
-- starting ACK's) sets no indexed column, so SQLite touches none of the runs' indexes.
-- name: run_cas_sequence
-- desc: Compare-and-set on a Run's version that only bumps it and sets its event sequence; no row when it moved.
UPDATE runs SET version = version + 1, event_sequence = :event_sequence, updated_at_ms = :now
WHERE id = :id AND version = :expected_version

-- name: run_list_first
-- desc: The first page of a project's runs, newest first.
SELECT * FROM runs WHERE project_id = :project_id
ORDER BY created_at_ms DESC, id DESC LIMIT :limit

-- name: run_list_after
-- desc: The next page of a project's runs, newest first, before the (created_at_ms, id) cursor.
SELECT * FROM runs WHERE project_id = :project_id
  AND (created_at_ms < :cursor_ms OR (created_at_ms = :cursor_ms AND id < :cursor_id))
ORDER BY created_at_ms DESC, id DESC LIMIT :limit

-- name: run_list_task_first
-- desc: The first page of one task's runs, newest first.
SELECT * FROM runs WHERE project_id = :project_id AND task_id = :task_id
ORDER BY created_at_ms DESC, id DESC LIMIT :limit

-- name: run_list_task_after
-- desc: The next page of one task's runs, newest first, before the (created_at_ms, id) cursor.
SELECT * FROM runs WHERE project_id = :project_id AND task_id = :task_id
  AND (created_at_ms < :cursor_ms OR (created_at_ms = :cursor_ms AND id < :cursor_id))
ORDER BY created_at_ms DESC, id DESC LIMIT :limit

-- name: attempt_insert
-- desc: Creates an Attempt of a run with callback sequence 0.
INSERT INTO run_attempts (id, run_id, attempt, status, executor_type, created_at_ms, callback_sequence)
VALUES (:id, :run_id, :attempt, :status, :executor_type, :now, 0)

-- name: attempt_get
-- desc: One Attempt by id, unlocked.
SELECT * FROM run_attempts WHERE id = :id

-- name: attempt_latest
-- desc: A run's newest Attempt, the one any lease, ACK or completion must refer to.
SELECT * FROM run_attempts WHERE run_id = :run_id ORDER BY attempt DESC LIMIT 1

-- name: attempt_list
-- desc: A run's attempts in order (at most 64) for run detail views.
SELECT * FROM run_attempts WHERE run_id = :run_id ORDER BY attempt LIMIT 64

-- name: attempt_cas
-- desc: Compare-and-set of an Attempt on its status and callback sequence; no row when it moved on.
UPDATE run_attempts SET status = :status, worker_id = :worker_id, pid = :pid, executor_handle = :executor_handle,
  log_artifact_id = :log_artifact_id, deadline_at_ms = :deadline_at_ms, callback_token_hash = :callback_token_hash,
  callback_sequence = :callback_sequence, started_at_ms = :started_at_ms, finished_at_ms = :finished_at_ms,
  exit_code = :exit_code, error_code = :error_code
WHERE id = :id AND status = :expected_status AND callback_sequence = :expected_callback_sequence

-- name: event_insert
-- desc: Appends one run event at the run's next sequence number.
INSERT INTO run_events (id, run_id, sequence, type, dedupe_key, actor_type, actor_id, attempt_id, payload_json,
  created_at_ms)
VALUES (:id, :run_id, :sequence, :type, :dedupe_key, :actor_type, :actor_id, :attempt_id, :payload_json, :now)

-- name: event_insert_pair
-- desc: Appends two run events of one run at consecutive sequences in one statement (the second's params end in _2).
INSERT INTO run_events (id, run_id, sequence, type, dedupe_key, actor_type, actor_id, attempt_id, payload_json,
  created_at_ms)
VALUES (:id, :run_id, :sequence, :type, :dedupe_key, :actor_type, :actor_id, :attempt_id, :payload_json, :now),
  (:id_2, :run_id, :sequence_2, :type_2, :dedupe_key_2, :actor_type_2, :actor_id_2, :attempt_id_2, :payload_json_2,
   :now)

-- name: event_list
-- desc: A page of a run's events after a sequence number, for event streams and history.
SELECT * FROM run_events WHERE run_id = :run_id AND sequence > :after ORDER BY sequence LIMIT :limit
