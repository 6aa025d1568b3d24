-- SQLite overrides. Writers are serialised by BEGIN IMMEDIATE, so a plain read is a locked read (locks.sql).

-- The candidate page must read the partial index in its order: without statistics SQLite would
-- otherwise pick another index and sort the whole backlog.

-- name: candidate_first
-- desc: First page of dispatch candidates in dispatch order, forced onto the partial candidate index.
SELECT r.id AS run_id, r.project_id, r.task_id, r.task_revision, r.priority, r.queued_at_ms,
  (SELECT a.id FROM run_attempts a WHERE a.run_id = r.id ORDER BY a.attempt DESC LIMIT 1) AS attempt_id,
  (SELECT a.status FROM run_attempts a WHERE a.run_id = r.id ORDER BY a.attempt DESC LIMIT 1) AS attempt_status,
  (SELECT a.executor_type FROM run_attempts a WHERE a.run_id = r.id ORDER BY a.attempt DESC LIMIT 1) AS executor_type
FROM runs r INDEXED BY runs_dispatch_candidates WHERE r.status = 'queued' AND r.cancel_requested_at_ms IS NULL
ORDER BY r.priority DESC, r.queued_at_ms, r.id LIMIT :limit

-- name: candidate_after
-- desc: Next page of dispatch candidates after the cursor, forced onto the partial candidate index.
SELECT r.id AS run_id, r.project_id, r.task_id, r.task_revision, r.priority, r.queued_at_ms,
  (SELECT a.id FROM run_attempts a WHERE a.run_id = r.id ORDER BY a.attempt DESC LIMIT 1) AS attempt_id,
  (SELECT a.status FROM run_attempts a WHERE a.run_id = r.id ORDER BY a.attempt DESC LIMIT 1) AS attempt_status,
  (SELECT a.executor_type FROM run_attempts a WHERE a.run_id = r.id ORDER BY a.attempt DESC LIMIT 1) AS executor_type
FROM runs r INDEXED BY runs_dispatch_candidates WHERE r.status = 'queued' AND r.cancel_requested_at_ms IS NULL
  AND (r.priority < :c_priority OR (r.priority = :c_priority AND (r.queued_at_ms > :c_queued
       OR (r.queued_at_ms = :c_queued AND r.id > :c_id))))
ORDER BY r.priority DESC, r.queued_at_ms, r.id LIMIT :limit

-- The lease statements whose row change moves the worker's active-lease counter: on SQLite the
-- triggers of run_leases (migration 0010) move it within the same statement, so each answers that it
-- did (``slot_counted`` / ``slot_freed`` = 1) and the caller writes no second statement.

-- name: lease_insert_claim
-- desc: A new claim's lease row at lease generation 1 (its trigger takes the worker's slot); no row when a lease exists.
INSERT INTO run_leases (attempt_id, run_id, status, version, lease_generation, worker_id, worker_session_id,
  worker_generation, lease_token_digest, acquired_at_ms, renewed_at_ms, expires_at_ms, updated_at_ms)
VALUES (:attempt_id, :run_id, 'leased', 0, 1, :worker_id, :worker_session_id, :worker_generation,
  :lease_token_digest, :now, :now, :expires_at_ms, :now)
ON CONFLICT (attempt_id) DO NOTHING
RETURNING *, 1 AS slot_counted

-- name: lease_reacquire_claim
-- desc: Re-leases a lease row for a new claim (new lease generation, CAS on its version); its trigger moves the slots.
UPDATE run_leases SET status = 'leased', version = version + 1, lease_generation = lease_generation + 1,
  worker_id = :worker_id, worker_session_id = :worker_session_id, worker_generation = :worker_generation,
  lease_token_digest = :lease_token_digest, acquired_at_ms = :now, renewed_at_ms = :now,
  expires_at_ms = :expires_at_ms, released_at_ms = NULL, release_reason = NULL, completed_at_ms = NULL,
  updated_at_ms = :now
WHERE attempt_id = :attempt_id AND version = :expected_version
RETURNING *, 1 AS slot_counted

-- name: lease_complete
-- desc: Completes a live lease (CAS on its version); its trigger frees the worker's slot; no row when it moved.
UPDATE run_leases SET status = 'completed', version = version + 1, completed_at_ms = :now, updated_at_ms = :now
WHERE attempt_id = :attempt_id AND version = :expected_version AND status = 'leased'
RETURNING 1 AS slot_freed
