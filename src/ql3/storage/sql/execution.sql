-- Workers, leases, candidates and retry policies.

-- name: worker_get
-- desc: One worker row by id: its session, generation, status, version and slot counter.
SELECT * FROM workers WHERE worker_id = :worker_id

-- name: worker_insert
-- desc: Registers a new worker with its first session at generation 1; no row when the worker id exists.
INSERT INTO workers (worker_id, session_id, generation, status, version, capabilities_json, capabilities_hash,
  max_concurrent_runs, session_lease_ms, registered_at_ms, last_heartbeat_at_ms, lease_expires_at_ms, updated_at_ms)
VALUES (:worker_id, :session_id, 1, 'online', 0, :capabilities_json, :capabilities_hash, :max_concurrent_runs,
  :session_lease_ms, :now, :now, :lease_expires_at_ms, :now)
ON CONFLICT DO NOTHING

-- name: worker_replace_session
-- desc: Compare-and-set that starts a new session of a known worker, bumping its generation to fence the old one.
UPDATE workers SET session_id = :session_id, generation = generation + 1, status = 'online', version = version + 1,
  capabilities_json = :capabilities_json, capabilities_hash = :capabilities_hash,
  max_concurrent_runs = :max_concurrent_runs, session_lease_ms = :session_lease_ms, registered_at_ms = :now,
  last_heartbeat_at_ms = :now, lease_expires_at_ms = :lease_expires_at_ms, updated_at_ms = :now
WHERE worker_id = :worker_id AND version = :expected_version

-- name: worker_cas
-- desc: Compare-and-set of a worker session's status and heartbeat on session, generation and version.
UPDATE workers SET status = :status, version = version + 1, last_heartbeat_at_ms = :last_heartbeat_at_ms,
  lease_expires_at_ms = :lease_expires_at_ms, updated_at_ms = :now
WHERE worker_id = :worker_id AND session_id = :session_id AND generation = :generation AND version = :expected_version

-- name: worker_list
-- desc: A keyset page of all workers by id, for the workers view.
SELECT w.* FROM workers w WHERE w.worker_id > :after ORDER BY w.worker_id LIMIT :limit

-- name: worker_snapshot_page
-- desc: A page of online workers with a live session lease: the placement candidates of a dispatch cycle.
SELECT w.worker_id, w.session_id, w.generation, w.capabilities_json, w.max_concurrent_runs, w.active_leases
FROM workers w
WHERE w.status = 'online' AND w.lease_expires_at_ms > :now AND w.worker_id > :after
ORDER BY w.worker_id LIMIT :limit

-- name: worker_snapshot_one
-- desc: One named worker if it is online with a live session lease, for a claim aimed at that worker.
SELECT w.worker_id, w.session_id, w.generation, w.capabilities_json, w.max_concurrent_runs, w.active_leases
FROM workers w
WHERE w.worker_id = :worker_id AND w.status = 'online' AND w.lease_expires_at_ms > :now

-- name: worker_leases_adjust
-- desc: Adds delta (+1 or -1) to a worker's active-lease counter when a lease is taken or ends.
UPDATE workers SET active_leases = active_leases + :delta WHERE worker_id = :worker_id

-- name: candidate_first
-- desc: The first page of queued runs without a cancel request, in dispatch order (priority, queue time, id).
SELECT r.id AS run_id, r.project_id, r.task_id, r.task_revision, r.priority, r.queued_at_ms,
  (SELECT a.id FROM run_attempts a WHERE a.run_id = r.id ORDER BY a.attempt DESC LIMIT 1) AS attempt_id,
  (SELECT a.status FROM run_attempts a WHERE a.run_id = r.id ORDER BY a.attempt DESC LIMIT 1) AS attempt_status,
  (SELECT a.executor_type FROM run_attempts a WHERE a.run_id = r.id ORDER BY a.attempt DESC LIMIT 1) AS executor_type
FROM runs r WHERE r.status = 'queued' AND r.cancel_requested_at_ms IS NULL
ORDER BY r.priority DESC, r.queued_at_ms, r.id LIMIT :limit

-- name: candidate_after
-- desc: The next page of dispatch candidates after the (priority, queued_at_ms, id) cursor.
SELECT r.id AS run_id, r.project_id, r.task_id, r.task_revision, r.priority, r.queued_at_ms,
  (SELECT a.id FROM run_attempts a WHERE a.run_id = r.id ORDER BY a.attempt DESC LIMIT 1) AS attempt_id,
  (SELECT a.status FROM run_attempts a WHERE a.run_id = r.id ORDER BY a.attempt DESC LIMIT 1) AS attempt_status,
  (SELECT a.executor_type FROM run_attempts a WHERE a.run_id = r.id ORDER BY a.attempt DESC LIMIT 1) AS executor_type
FROM runs r WHERE r.status = 'queued' AND r.cancel_requested_at_ms IS NULL
  AND (r.priority < :c_priority OR (r.priority = :c_priority AND (r.queued_at_ms > :c_queued
       OR (r.queued_at_ms = :c_queued AND r.id > :c_id))))
ORDER BY r.priority DESC, r.queued_at_ms, r.id LIMIT :limit

-- name: lease_get
-- desc: The lease row of an attempt, unlocked.
SELECT * FROM run_leases WHERE attempt_id = :attempt_id

-- name: lease_renew
-- desc: Extends a live lease's expiry, compare-and-set on its version.
UPDATE run_leases SET version = version + 1, renewed_at_ms = :now, expires_at_ms = :expires_at_ms, updated_at_ms = :now
WHERE attempt_id = :attempt_id AND version = :expected_version AND status = 'leased'

-- name: lease_defer
-- desc: Gives a live lease a new expiry without moving its version (a paused scanner's own worker), CAS on the version.
UPDATE run_leases SET expires_at_ms = :expires_at_ms, updated_at_ms = :now
WHERE attempt_id = :attempt_id AND version = :expected_version AND status = 'leased'

-- ``slot_freed`` says whether the statement also moved the holder's active-lease counter
-- (PostgreSQL does it in the same statement); when it is 0 the caller does.
-- name: lease_complete
-- desc: Marks a live lease completed when its attempt ends, CAS on its version; no row when it moved.
UPDATE run_leases SET status = 'completed', version = version + 1, completed_at_ms = :now, updated_at_ms = :now
WHERE attempt_id = :attempt_id AND version = :expected_version AND status = 'leased'
RETURNING 0 AS slot_freed

-- name: lease_release
-- desc: Releases a live lease with a reason (lost, expired, stopped), compare-and-set on its version.
UPDATE run_leases SET status = 'released', version = version + 1, released_at_ms = :now,
  release_reason = :reason, updated_at_ms = :now
WHERE attempt_id = :attempt_id AND version = :expected_version AND status = 'leased'

-- name: lease_recovery_first
-- desc: First page of leases taken before this dispatcher started whose attempt is still claimed: offers to rebuild.
SELECT l.attempt_id, l.run_id, l.expires_at_ms FROM run_leases l
JOIN run_attempts a ON a.id = l.attempt_id AND a.status = 'claimed'
WHERE l.status = 'leased' AND l.acquired_at_ms <= :since
ORDER BY l.expires_at_ms, l.attempt_id LIMIT :limit

-- name: lease_recovery_after
-- desc: Next page of leases to rebuild offers for, after the (expires_at_ms, attempt_id) cursor.
SELECT l.attempt_id, l.run_id, l.expires_at_ms FROM run_leases l
JOIN run_attempts a ON a.id = l.attempt_id AND a.status = 'claimed'
WHERE l.status = 'leased' AND l.acquired_at_ms <= :since
  AND (l.expires_at_ms > :c_expires OR (l.expires_at_ms = :c_expires AND l.attempt_id > :c_attempt))
ORDER BY l.expires_at_ms, l.attempt_id LIMIT :limit

-- name: lease_expired_page
-- desc: A page of live leases past their expiry, oldest first, for the lease-expiry loop to end.
SELECT attempt_id, run_id, expires_at_ms FROM run_leases
WHERE status = 'leased' AND expires_at_ms <= :now
  AND NOT EXISTS (SELECT 1 FROM parked_items k WHERE k.item_kind = 'lease' AND k.item_key = run_leases.attempt_id
    AND k.next_retry_at_ms > :now)
ORDER BY expires_at_ms, attempt_id LIMIT :limit

-- name: retry_policy_insert
-- desc: Stores a run's retry policy (max attempts, retry on lost, safety, backoff bounds).
INSERT INTO run_retry_policies (run_id, max_attempts, retry_on_lost, safety, backoff_min_ms, backoff_max_ms, version)
VALUES (:run_id, :max_attempts, :retry_on_lost, :safety, :backoff_min_ms, :backoff_max_ms, 0)

-- name: retry_policy_get
-- desc: A run's retry policy, to decide whether a lost attempt is retried.
SELECT * FROM run_retry_policies WHERE run_id = :run_id

-- name: retry_policy_schedule
-- desc: Sets or clears a run's next retry time, compare-and-set on the policy version.
UPDATE run_retry_policies SET next_retry_at_ms = :next_retry_at_ms, version = version + 1
WHERE run_id = :run_id AND version = :expected_version

-- name: retry_due_page
-- desc: A page of runs whose scheduled retry is due, earliest first, for the retry loop.
SELECT p.run_id FROM run_retry_policies p
WHERE p.next_retry_at_ms IS NOT NULL AND p.next_retry_at_ms <= :now
  AND NOT EXISTS (SELECT 1 FROM parked_items k WHERE k.item_kind = 'retry' AND k.item_key = p.run_id
    AND k.next_retry_at_ms > :now)
ORDER BY p.next_retry_at_ms, p.run_id LIMIT :limit

-- The claim path (docs/dispatch.md): the attempt with the id of the run's latest attempt, so one
-- statement both locks the attempt (the dialect override adds the row lock) and tells whether it is
-- still the latest.
-- name: attempt_lock_with_latest
-- desc: An attempt plus the id of its run's newest attempt, so a claim sees in one read whether it is still the latest.
SELECT a.*, (SELECT b.id FROM run_attempts b WHERE b.run_id = a.run_id ORDER BY b.attempt DESC LIMIT 1)
  AS latest_attempt_id
FROM run_attempts a WHERE a.id = :id

-- A new claim's lease row, or no row when the attempt already has one (the caller then locks and
-- reacquires it); ``slot_counted`` says whether the statement also moved the worker's
-- active-lease counter (PostgreSQL does it in the same statement); when it is 0 the caller does.
-- name: lease_insert_claim
-- desc: A new claim's lease row at lease generation 1; no row when the attempt already has a lease to reacquire.
INSERT INTO run_leases (attempt_id, run_id, status, version, lease_generation, worker_id, worker_session_id,
  worker_generation, lease_token_digest, acquired_at_ms, renewed_at_ms, expires_at_ms, updated_at_ms)
VALUES (:attempt_id, :run_id, 'leased', 0, 1, :worker_id, :worker_session_id, :worker_generation,
  :lease_token_digest, :now, :now, :expires_at_ms, :now)
ON CONFLICT (attempt_id) DO NOTHING
RETURNING *, 0 AS slot_counted

-- name: lease_reacquire_claim
-- desc: Re-leases an ended lease row for a new claim, bumping its lease generation; CAS on its version.
UPDATE run_leases SET status = 'leased', version = version + 1, lease_generation = lease_generation + 1,
  worker_id = :worker_id, worker_session_id = :worker_session_id, worker_generation = :worker_generation,
  lease_token_digest = :lease_token_digest, acquired_at_ms = :now, renewed_at_ms = :now,
  expires_at_ms = :expires_at_ms, released_at_ms = NULL, release_reason = NULL, completed_at_ms = NULL,
  updated_at_ms = :now
WHERE attempt_id = :attempt_id AND version = :expected_version
RETURNING *, 0 AS slot_counted
