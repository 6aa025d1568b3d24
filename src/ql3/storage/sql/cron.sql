-- Cron admission.

-- name: schedule_get
-- desc: A task's cron schedule row: expression, next fire time and state version.
SELECT * FROM task_schedules WHERE task_id = :task_id

-- name: schedule_upsert
-- desc: Creates or replaces a task's schedule (revision, expression, next fire time), bumping its state version.
INSERT INTO task_schedules (task_id, project_id, task_revision, cron_expr, next_fire_at_ms, last_scheduled_at_ms,
  state_version, updated_at_ms)
VALUES (:task_id, :project_id, :task_revision, :cron_expr, :next_fire_at_ms, NULL, 0, :now)
ON CONFLICT (task_id) DO UPDATE SET task_revision = excluded.task_revision, cron_expr = excluded.cron_expr,
  next_fire_at_ms = excluded.next_fire_at_ms, state_version = task_schedules.state_version + 1,
  updated_at_ms = excluded.updated_at_ms

-- name: schedule_delete
-- desc: Removes a task's schedule, when the task loses its cron expression or is deleted.
DELETE FROM task_schedules WHERE task_id = :task_id

-- name: schedule_due_page
-- desc: A page of schedules whose next fire time has passed, earliest first, for cron admission.
SELECT task_id, next_fire_at_ms FROM task_schedules
WHERE next_fire_at_ms IS NOT NULL AND next_fire_at_ms <= :now
  AND NOT EXISTS (SELECT 1 FROM parked_items k WHERE k.item_kind = 'schedule' AND k.item_key = task_schedules.task_id
    AND k.next_retry_at_ms > :now)
ORDER BY next_fire_at_ms, task_id LIMIT :limit

-- name: schedule_advance
-- desc: Moves a schedule's cursor to its next fire time after admitting a run, CAS on its state version.
UPDATE task_schedules SET next_fire_at_ms = :next_fire_at_ms, last_scheduled_at_ms = :last_scheduled_at_ms,
  state_version = state_version + 1, updated_at_ms = :now
WHERE task_id = :task_id AND state_version = :expected_version

-- name: task_active_runs
-- desc: A task's non-terminal runs, oldest first, for the overlap policy (skip or cancel_previous).
SELECT id, version FROM runs WHERE task_id = :task_id
  AND status IN ('queued', 'dispatching', 'running', 'retry_wait', 'lost', 'waiting_approval')
ORDER BY created_at_ms LIMIT :limit

-- name: task_get_any
-- desc: A task by id even if deleted, for loops that must see that a task went away.
SELECT id, project_id, name, enabled, revision, created_at_ms, updated_at_ms, deleted_at_ms FROM tasks WHERE id = :id

-- name: schedule_earliest
-- desc: The earliest next fire time of all schedules: when the cron loop must wake.
SELECT next_fire_at_ms FROM task_schedules WHERE next_fire_at_ms IS NOT NULL ORDER BY next_fire_at_ms LIMIT 1
