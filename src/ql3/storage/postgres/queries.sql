-- PostgreSQL overrides. Fixed lock order: Run -> Attempt -> lease/dispatch rows (the locked reads: locks.sql).

-- The claim's statements (lease_claims.claim runs them one by one on SQLite; on PostgreSQL it calls
-- ql3_claim, lease_claim below, which does the same in one statement). With the same locks in the same
-- order, in fewer round trips where they run on PostgreSQL: the attempt row lock
-- (after the Run's) answers whether it is the latest attempt too; a first lease is inserted without a
-- separate lock of its (absent) row, ON CONFLICT falling back to lock-and-reacquire; the lease row and the worker's
-- active-lease counter (whose row the claim already holds locked) move in one statement, and the
-- counter moves only when the lease row was written.

-- name: attempt_lock_with_latest
-- desc: An attempt row-locked, plus its run's newest attempt id, so a claim locks and checks latest at once.
SELECT a.*, (SELECT b.id FROM run_attempts b WHERE b.run_id = a.run_id ORDER BY b.attempt DESC LIMIT 1)
  AS latest_attempt_id
FROM run_attempts a WHERE a.id = :id FOR UPDATE OF a

-- name: lease_insert_claim
-- desc: A new claim's lease row and the worker's slot +1 in one statement; no row when a lease exists.
WITH l AS (
  INSERT INTO run_leases (attempt_id, run_id, status, version, lease_generation, worker_id, worker_session_id,
    worker_generation, lease_token_digest, acquired_at_ms, renewed_at_ms, expires_at_ms, updated_at_ms)
  VALUES (:attempt_id, :run_id, 'leased', 0, 1, :worker_id, :worker_session_id, :worker_generation,
    :lease_token_digest, :now, :now, :expires_at_ms, :now)
  ON CONFLICT (attempt_id) DO NOTHING
  RETURNING *
), w AS (
  UPDATE workers SET active_leases = active_leases + 1
  WHERE worker_id = :worker_id AND EXISTS (SELECT 1 FROM l)
  RETURNING 1
)
SELECT l.*, (SELECT count(*) FROM w) AS slot_counted FROM l

-- name: lease_reacquire_claim
-- desc: Re-leases an ended lease row (CAS on version, new lease generation) and moves the worker's slot with it.
WITH l AS (
  UPDATE run_leases SET status = 'leased', version = version + 1, lease_generation = lease_generation + 1,
    worker_id = :worker_id, worker_session_id = :worker_session_id, worker_generation = :worker_generation,
    lease_token_digest = :lease_token_digest, acquired_at_ms = :now, renewed_at_ms = :now,
    expires_at_ms = :expires_at_ms, released_at_ms = NULL, release_reason = NULL, completed_at_ms = NULL,
    updated_at_ms = :now
  WHERE attempt_id = :attempt_id AND version = :expected_version
  RETURNING *
), w AS (
  UPDATE workers SET active_leases = active_leases + 1
  WHERE worker_id = :worker_id AND EXISTS (SELECT 1 FROM l)
  RETURNING 1
)
SELECT l.*, (SELECT count(*) FROM w) AS slot_counted FROM l

-- The completion's lease row and the holder's slot -1 in one statement (lock order lease -> worker,
-- as leases.end_attempt runs them one by one on SQLite); the counter moves only when the lease row
-- was written.
-- name: lease_complete
-- desc: Completes a live lease (CAS on its version) and frees its worker's slot; no row when it moved.
WITH l AS (
  UPDATE run_leases SET status = 'completed', version = version + 1, completed_at_ms = :now, updated_at_ms = :now
  WHERE attempt_id = :attempt_id AND version = :expected_version AND status = 'leased'
  RETURNING worker_id
), w AS (
  UPDATE workers SET active_leases = active_leases - 1
  WHERE worker_id = (SELECT worker_id FROM l)
  RETURNING 1
)
SELECT (SELECT count(*) FROM w) AS slot_freed FROM l
