-- Cron admission.

-- name: schedule_get
-- desc: A task's cron schedule row: expression, next fire time and state version.
SELECT * FROM task_schedules WHERE task_id = :task_id

-- name: schedule_delete
-- desc: Removes a task's schedule, when the task loses its cron expression or is deleted.
DELETE FROM task_schedules WHERE task_id = :task_id

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

-- name: schedule_write
-- desc: Creates or moves a task's cron cursor (revision, expression, occurrence and due time), bumping its state version.
INSERT INTO task_schedules (task_id, project_id, task_revision, cron_expr, next_fire_at_ms, next_occurrence_ms,
  last_scheduled_at_ms, state_version, updated_at_ms)
VALUES (:task_id, :project_id, :task_revision, :cron_expr, :next_fire_at_ms, :next_occurrence_ms,
  :last_scheduled_at_ms, 0, :now)
ON CONFLICT (task_id) DO UPDATE SET task_revision = excluded.task_revision, cron_expr = excluded.cron_expr,
  next_fire_at_ms = excluded.next_fire_at_ms, next_occurrence_ms = excluded.next_occurrence_ms,
  last_scheduled_at_ms = COALESCE(excluded.last_scheduled_at_ms, task_schedules.last_scheduled_at_ms),
  state_version = task_schedules.state_version + 1, updated_at_ms = excluded.updated_at_ms

-- name: cron_skip_last
-- desc: A task's latest skipped-occurrence record, which an unbroken run of skips for the same reason extends.
SELECT * FROM cron_skips WHERE task_id = :task_id ORDER BY occurrence_ms DESC LIMIT 1

-- name: cron_skip_insert
-- desc: Records one skipped occurrence, or a range of consecutive ones, with its reason.
INSERT INTO cron_skips (task_id, occurrence_ms, project_id, task_revision, last_occurrence_ms, occurrences, reason,
  created_at_ms)
VALUES (:task_id, :occurrence_ms, :project_id, :task_revision, :last_occurrence_ms, :occurrences, :reason, :now)

-- name: cron_skip_extend
-- desc: Extends a task's latest skipped-occurrence record by the next occurrences skipped for the same reason.
UPDATE cron_skips SET last_occurrence_ms = :last_occurrence_ms, occurrences = occurrences + :occurrences,
  task_revision = :task_revision, created_at_ms = :now
WHERE task_id = :task_id AND occurrence_ms = :occurrence_ms

-- name: cron_skip_trim
-- desc: Drops a task's skipped-occurrence records beyond the newest ones kept.
DELETE FROM cron_skips WHERE task_id = :task_id AND occurrence_ms <= (
  SELECT occurrence_ms FROM cron_skips WHERE task_id = :task_id ORDER BY occurrence_ms DESC LIMIT 1 OFFSET :keep)

-- name: cron_skip_list
-- desc: A task's skipped-occurrence records, newest first, before an occurrence cursor.
SELECT * FROM cron_skips WHERE task_id = :task_id AND occurrence_ms < :before ORDER BY occurrence_ms DESC LIMIT :limit

-- name: cron_skip_totals
-- desc: Skipped occurrences recorded (within the per-task bound), by reason, for /metrics.
SELECT reason, COALESCE(SUM(occurrences), 0) AS occurrences FROM cron_skips GROUP BY reason ORDER BY reason LIMIT 16

-- name: cron_on_start_tasks
-- desc: A page of live, enabled tasks whose current revision asks for a run at each server start, by id.
SELECT t.id FROM tasks t JOIN task_revisions r ON r.task_id = t.id AND r.revision = t.revision
WHERE t.deleted_at_ms IS NULL AND t.enabled = 1 AND t.id > :after
  AND r.spec_json LIKE :pattern
ORDER BY t.id LIMIT :limit

-- name: start_epoch_begin
-- desc: A server start: a new epoch unless the last server did not stop cleanly (a crash keeps it).
INSERT INTO cron_start_epoch (singleton, epoch, running, updated_at_ms) VALUES (1, 1, 1, :now)
ON CONFLICT (singleton) DO UPDATE SET
  epoch = CASE WHEN cron_start_epoch.running = 1 THEN cron_start_epoch.epoch ELSE cron_start_epoch.epoch + 1 END,
  running = 1, updated_at_ms = excluded.updated_at_ms

-- name: start_epoch_get
-- desc: The current server start epoch and whether a server is marked running.
SELECT epoch, running FROM cron_start_epoch WHERE singleton = 1

-- name: start_epoch_stop
-- desc: A clean server stop: the next start opens a new epoch.
UPDATE cron_start_epoch SET running = 0, updated_at_ms = :now WHERE singleton = 1

-- name: cron_late_runs
-- desc: Cron runs still queued, created after a (time, id) cursor up to a time, oldest first: waiting for a slot too long.
SELECT id, project_id, task_id, created_at_ms FROM runs
WHERE status = 'queued' AND created_at_ms <= :through_ms AND trigger_type = 'cron'
  AND (created_at_ms > :after_ms OR (created_at_ms = :after_ms AND id > :after_id))
ORDER BY created_at_ms, id LIMIT :limit
