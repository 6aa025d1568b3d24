-- Aggregate, low-cardinality counts for /metrics (bounded by the fixed sets of statuses).

-- name: metrics_runs_by_status
SELECT status, count(*) AS n FROM runs GROUP BY status

-- name: metrics_workers_by_status
SELECT status, count(*) AS n FROM workers GROUP BY status

-- name: metrics_cancellations_by_status
SELECT status, count(*) AS n FROM cancellation_dispatches GROUP BY status

-- name: metrics_actions_by_status
SELECT status, count(*) AS n FROM approved_action_executions GROUP BY status

-- name: metrics_queued_by_revision
SELECT task_id, task_revision, count(*) AS n FROM runs WHERE status = 'queued'
GROUP BY task_id, task_revision ORDER BY n DESC, task_id, task_revision LIMIT :limit
