-- Cron admission.

-- name: schedule_get
SELECT * FROM task_schedules WHERE task_id = :task_id

-- name: schedule_upsert
INSERT INTO task_schedules (task_id, project_id, task_revision, cron_expr, next_fire_at_ms, last_scheduled_at_ms,
  state_version, updated_at_ms)
VALUES (:task_id, :project_id, :task_revision, :cron_expr, :next_fire_at_ms, NULL, 0, :now)
ON CONFLICT (task_id) DO UPDATE SET task_revision = excluded.task_revision, cron_expr = excluded.cron_expr,
  next_fire_at_ms = excluded.next_fire_at_ms, state_version = task_schedules.state_version + 1,
  updated_at_ms = excluded.updated_at_ms

-- name: schedule_delete
DELETE FROM task_schedules WHERE task_id = :task_id

-- name: schedule_due_page
SELECT task_id, next_fire_at_ms FROM task_schedules
WHERE next_fire_at_ms IS NOT NULL AND next_fire_at_ms <= :now
ORDER BY next_fire_at_ms, task_id LIMIT :limit

-- name: schedule_advance
UPDATE task_schedules SET next_fire_at_ms = :next_fire_at_ms, last_scheduled_at_ms = :last_scheduled_at_ms,
  state_version = state_version + 1, updated_at_ms = :now
WHERE task_id = :task_id AND state_version = :expected_version

-- name: task_active_runs
SELECT id, version FROM runs WHERE task_id = :task_id
  AND status IN ('queued', 'dispatching', 'running', 'retry_wait', 'lost', 'waiting_approval')
ORDER BY created_at_ms LIMIT :limit

-- name: task_get_any
SELECT id, project_id, name, enabled, revision, created_at_ms, updated_at_ms, deleted_at_ms FROM tasks WHERE id = :id

-- name: schedule_earliest
SELECT next_fire_at_ms FROM task_schedules WHERE next_fire_at_ms IS NOT NULL ORDER BY next_fire_at_ms LIMIT 1
