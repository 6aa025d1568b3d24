-- Cluster mode (docs/cluster.md): worker credentials, the pull service and lease-control stops.

-- name: worker_principal_active
-- desc: The enabled worker principal with a name, to refuse a second credential of the same name.
SELECT id, name, created_at_ms, expires_at_ms, last_used_at_ms FROM principals
WHERE kind = 'worker' AND name = :name AND disabled_at_ms IS NULL
ORDER BY id LIMIT 1

-- name: worker_principal_get
-- desc: One worker credential by id with its revocation and last use.
SELECT id, name, created_at_ms, expires_at_ms, disabled_at_ms AS revoked_at_ms, last_used_at_ms FROM principals
WHERE kind = 'worker' AND id = :id

-- name: worker_principal_list
-- desc: A keyset page of worker credentials by id.
SELECT id, name, created_at_ms, expires_at_ms, disabled_at_ms AS revoked_at_ms, last_used_at_ms FROM principals
WHERE kind = 'worker' AND id > :after ORDER BY id LIMIT :limit

-- The live leases one worker holds (index run_leases_worker), a bounded page by attempt id.
-- name: worker_live_leases
-- desc: A page of the live leases one worker holds, by attempt id (pull service, re-adoption).
SELECT * FROM run_leases
WHERE worker_id = :worker_id AND status = 'leased' AND attempt_id > :after
ORDER BY attempt_id LIMIT :limit

-- The live leases of one worker session whose run has a committed stop intent.
-- name: worker_stop_requests
-- desc: Live leases of one worker session whose run has a stop intent, for lease-control stops.
SELECT l.attempt_id, l.run_id FROM run_leases l JOIN runs r ON r.id = l.run_id
WHERE l.worker_id = :worker_id AND l.worker_session_id = :session_id AND l.status = 'leased'
  AND r.cancel_requested_at_ms IS NOT NULL
  AND r.status NOT IN ('succeeded', 'failed', 'cancelled', 'timed_out')
ORDER BY l.attempt_id LIMIT :limit

-- Serialises the first start of several replicas (owner creation); SQLite's write lock already does.
-- name: cluster_bootstrap_lock
-- desc: Serialises the first start of several replicas so one owner is created (a no-op where writes are serial).
SELECT 1 AS locked

-- name: worker_labels_get
-- desc: The labels a worker id may register with, who approved them, and its pending request.
SELECT * FROM worker_label_approvals WHERE worker_id = :worker_id

-- name: worker_labels_bind
-- desc: Binds a worker id's labels at its first registration; no row when it already has approved labels.
INSERT INTO worker_label_approvals (worker_id, labels_json, approved_by, approved_at_ms)
VALUES (:worker_id, :labels_json, NULL, :now)
ON CONFLICT DO NOTHING

-- name: worker_labels_approve
-- desc: Sets the labels a worker id may register with (an admin, or a token minted with them); clears the request.
INSERT INTO worker_label_approvals (worker_id, labels_json, approved_by, approved_at_ms)
VALUES (:worker_id, :labels_json, :approved_by, :now)
ON CONFLICT (worker_id) DO UPDATE SET labels_json = excluded.labels_json, approved_by = excluded.approved_by,
  approved_at_ms = excluded.approved_at_ms, requested_labels_json = NULL, requested_at_ms = NULL

-- name: worker_labels_request
-- desc: Records the labels of a refused registration as the worker id's pending request (the last one wins).
UPDATE worker_label_approvals SET requested_labels_json = :labels_json, requested_at_ms = :now
WHERE worker_id = :worker_id
