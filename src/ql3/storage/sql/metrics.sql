-- Aggregate, low-cardinality counts for /metrics (bounded by the fixed sets of statuses).

-- name: metrics_runs_by_status
-- desc: Runs counted by status, for /metrics.
SELECT status, count(*) AS n FROM runs GROUP BY status

-- name: metrics_workers_by_status
-- desc: Workers counted by status, for /metrics.
SELECT status, count(*) AS n FROM workers GROUP BY status

-- name: metrics_cancellations_by_status
-- desc: Cancellation dispatches counted by status, for /metrics.
SELECT status, count(*) AS n FROM cancellation_dispatches GROUP BY status

-- name: metrics_actions_by_status
-- desc: Approved-action executions counted by status, for /metrics.
SELECT status, count(*) AS n FROM approved_action_executions GROUP BY status

-- Alerting (docs/notifications.md): newest finish per live task and outcome, queue depth, and the runs
-- finished since a cursor (for the duration histogram). Bounded by the number of tasks and a page.

-- name: metrics_task_outcomes
-- desc: Per live task, its newest success, failure and timeout finish times, for alerting metrics.
SELECT p.name AS project, t.name AS task,
  (SELECT max(r.finished_at_ms) FROM runs r WHERE r.task_id = t.id AND r.status = 'succeeded') AS last_success_ms,
  (SELECT max(r.finished_at_ms) FROM runs r WHERE r.task_id = t.id AND r.status = 'failed') AS last_failed_ms,
  (SELECT max(r.finished_at_ms) FROM runs r WHERE r.task_id = t.id AND r.status = 'timed_out') AS last_timed_out_ms
FROM tasks t JOIN projects p ON p.id = t.project_id WHERE t.deleted_at_ms IS NULL
ORDER BY p.name, t.name LIMIT :limit

-- name: metrics_queue_depth
-- desc: The number of queued runs, for /metrics.
SELECT count(*) AS n FROM runs WHERE status = 'queued'

-- name: metrics_finished_since
-- desc: Runs finished after a cursor and up to a bound, with start and finish, for the duration histogram.
SELECT id, started_at_ms, finished_at_ms FROM runs
WHERE finished_at_ms IS NOT NULL AND finished_at_ms <= :until_ms
  AND (finished_at_ms > :after_ms OR (finished_at_ms = :after_ms AND id > :after_id))
  AND status IN ('succeeded', 'failed', 'cancelled', 'timed_out')
ORDER BY finished_at_ms, id LIMIT :limit

-- name: metrics_queued_by_revision
-- desc: Queued runs counted per task revision, largest first, for /metrics.
SELECT task_id, task_revision, count(*) AS n FROM runs WHERE status = 'queued'
GROUP BY task_id, task_revision ORDER BY n DESC, task_id, task_revision LIMIT :limit
