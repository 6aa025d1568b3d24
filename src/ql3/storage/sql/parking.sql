-- Parked items (application/parking.py, docs/operations.md "Parked items").

-- name: parked_upsert
-- desc: Parks an item or counts one more failure of a parked one (first failure kept); answers the failure count.
INSERT INTO parked_items (item_kind, item_key, loop, project_id, reason, error_type, failures, first_failed_at_ms,
  last_failed_at_ms, next_retry_at_ms)
VALUES (:item_kind, :item_key, :loop, :project_id, :reason, :error_type, 1, :now, :now, :now)
ON CONFLICT (item_kind, item_key) DO UPDATE SET failures = parked_items.failures + 1, reason = excluded.reason,
  error_type = excluded.error_type, project_id = coalesce(excluded.project_id, parked_items.project_id),
  last_failed_at_ms = excluded.last_failed_at_ms
RETURNING failures

-- name: parked_set_retry
-- desc: Sets a parked item's next retry time (after parked_upsert counted its failure, same transaction).
UPDATE parked_items SET next_retry_at_ms = :next_retry_at_ms WHERE item_kind = :item_kind AND item_key = :item_key

-- name: parked_delete
-- desc: Un-parks one item (its handling succeeded).
DELETE FROM parked_items WHERE item_kind = :item_kind AND item_key = :item_key

-- name: parked_of_loop
-- desc: One loop's parked items (kind, key, next retry), bounded by the cap, for the loop's guard.
SELECT item_kind, item_key, next_retry_at_ms FROM parked_items WHERE loop = :loop
ORDER BY last_failed_at_ms, item_kind, item_key LIMIT :limit

-- name: parked_count_loop
-- desc: How many items one loop has parked.
SELECT count(*) AS n FROM parked_items WHERE loop = :loop

-- name: parked_evict_oldest
-- desc: Drops a loop's least recently failed parked items beyond its cap (they are retried at once).
DELETE FROM parked_items WHERE (item_kind, item_key) IN (
  SELECT item_kind, item_key FROM parked_items WHERE loop = :loop
  ORDER BY last_failed_at_ms, item_kind, item_key LIMIT :limit)

-- name: parked_drop_stale
-- desc: Drops a loop's parked items whose retry time passed before :before without a retry (their item is gone).
DELETE FROM parked_items WHERE loop = :loop AND next_retry_at_ms < :before

-- name: parked_list_project
-- desc: A project's parked items, most recent failure first, bounded.
SELECT * FROM parked_items WHERE project_id = :project_id
ORDER BY last_failed_at_ms DESC, item_kind, item_key LIMIT :limit

-- name: parked_list_all
-- desc: Every parked item of the server, most recent failure first, bounded (the owner's view).
SELECT * FROM parked_items ORDER BY last_failed_at_ms DESC, item_kind, item_key LIMIT :limit

-- name: parked_get
-- desc: One parked item by kind and key.
SELECT * FROM parked_items WHERE item_kind = :item_kind AND item_key = :item_key

-- name: parked_retry_now
-- desc: Makes one parked item due at once (the retry-now action); the loop retries it on its next cycle.
UPDATE parked_items SET next_retry_at_ms = :now WHERE item_kind = :item_kind AND item_key = :item_key

-- name: metrics_parked_counts
-- desc: Parked items counted by loop and reason, for /metrics.
SELECT loop, reason, count(*) AS n FROM parked_items GROUP BY loop, reason

-- name: parked_item_project
-- desc: The project an item of a given kind belongs to (NULL when the item is gone or has none).
SELECT CASE CAST(:item_kind AS TEXT)
  WHEN 'approval' THEN (SELECT project_id FROM approval_requests WHERE id = :item_key)
  WHEN 'lease' THEN (SELECT r.project_id FROM run_attempts a JOIN runs r ON r.id = a.run_id WHERE a.id = :item_key)
  WHEN 'action' THEN (SELECT project_id FROM approved_action_dispatches WHERE id = :item_key)
  WHEN 'recovery' THEN (SELECT project_id FROM approved_action_dispatches WHERE id = :item_key)
  WHEN 'schedule' THEN (SELECT project_id FROM tasks WHERE id = :item_key)
  WHEN 'delivery' THEN (SELECT project_id FROM notification_outbox WHERE id = :item_key)
  WHEN 'project' THEN (SELECT id FROM projects WHERE id = :item_key)
  ELSE (SELECT project_id FROM runs WHERE id = :item_key) END AS project_id
