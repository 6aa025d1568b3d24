-- Retention policies and the bounded pruning pages (docs/retention.md). Candidates are terminal runs
-- that no approved-action receipt refers to; each page is small so no write holds a lock for long.

-- name: retention_get
-- desc: A project's retention policy.
SELECT * FROM retention_policies WHERE project_id = :project_id

-- name: retention_upsert
-- desc: Creates or replaces a project's retention policy, bumping its version.
INSERT INTO retention_policies (project_id, keep_days, runs_per_task, log_bytes_per_run, version, updated_at_ms)
VALUES (:project_id, :keep_days, :runs_per_task, :log_bytes_per_run, 1, :now)
ON CONFLICT (project_id) DO UPDATE SET keep_days = excluded.keep_days, runs_per_task = excluded.runs_per_task,
  log_bytes_per_run = excluded.log_bytes_per_run, version = retention_policies.version + 1,
  updated_at_ms = excluded.updated_at_ms

-- name: retention_policy_page
-- desc: A page of retention policies with their log cursors, by project id, for the pruning loop.
SELECT * FROM retention_policies WHERE project_id > :after ORDER BY project_id LIMIT :limit

-- name: retention_log_cursor
-- desc: Saves how far log pruning has gone in a project's finished attempts.
UPDATE retention_policies SET log_cursor_ms = :cursor_ms, log_cursor_id = :cursor_id
WHERE project_id = :project_id

-- name: retention_old_runs
-- desc: A project's terminal runs created before a time that no action receipt refers to, oldest first.
SELECT r.id FROM runs r WHERE r.project_id = :project_id AND r.created_at_ms < :before_ms
  AND r.status IN ('succeeded', 'failed', 'cancelled', 'timed_out')
  AND NOT EXISTS (SELECT 1 FROM approved_run_action_receipts x WHERE x.resource_type = 'run' AND x.resource_id = r.id)
ORDER BY r.created_at_ms, r.id LIMIT :limit

-- name: retention_task_page
-- desc: A page of a project's task ids, for pruning runs beyond each task's count limit.
SELECT id FROM tasks WHERE project_id = :project_id AND id > :after ORDER BY id LIMIT :limit

-- name: retention_task_boundary
-- desc: The newest run of a task beyond the ones to keep: where per-task pruning starts.
SELECT created_at_ms, id FROM runs WHERE task_id = :task_id
ORDER BY created_at_ms DESC, id DESC LIMIT 1 OFFSET :keep

-- name: retention_task_runs_before
-- desc: A task's terminal runs up to a boundary that no action receipt refers to, oldest first.
SELECT r.id FROM runs r WHERE r.task_id = :task_id
  AND (r.created_at_ms < :before_ms OR (r.created_at_ms = :before_ms AND r.id <= :before_id))
  AND r.status IN ('succeeded', 'failed', 'cancelled', 'timed_out')
  AND NOT EXISTS (SELECT 1 FROM approved_run_action_receipts x WHERE x.resource_type = 'run' AND x.resource_id = r.id)
ORDER BY r.created_at_ms, r.id LIMIT :limit

-- name: retention_finished_attempts
-- desc: A project's finished attempts after a cursor, oldest first, whose log files may be trimmed.
SELECT a.id, a.finished_at_ms FROM run_attempts a JOIN runs r ON r.id = a.run_id
WHERE a.finished_at_ms IS NOT NULL AND r.project_id = :project_id
  AND (a.finished_at_ms > :after_ms OR (a.finished_at_ms = :after_ms AND a.id > :after_id))
ORDER BY a.finished_at_ms, a.id LIMIT :limit

-- name: retention_outbox_prune
-- desc: Deletes a page of settled outbox rows last updated before a time.
DELETE FROM notification_outbox WHERE id IN (
  SELECT id FROM notification_outbox WHERE due_at_ms IS NULL AND updated_at_ms < :before_ms
  ORDER BY updated_at_ms, id LIMIT :limit)

-- name: retention_cron_skips_prune
-- desc: Deletes a page of a project's skipped-occurrence records recorded before a time.
DELETE FROM cron_skips WHERE (task_id, occurrence_ms) IN (
  SELECT task_id, occurrence_ms FROM cron_skips WHERE project_id = :project_id AND created_at_ms < :before_ms
  ORDER BY created_at_ms LIMIT :limit)
