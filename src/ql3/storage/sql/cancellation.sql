-- Durable cancellation dispatch (docs/contracts.md §4): claim/backoff rows, the supervisor's sources,
-- management reads.

-- name: cancel_dispatch_get_in_project
-- desc: A run's cancellation dispatch row only if it belongs to the project, for inspect and rearm.
SELECT * FROM cancellation_dispatches WHERE run_id = :run_id AND project_id = :project_id

-- name: cancel_dispatch_insert
-- desc: Creates the pending cancellation dispatch of a run, bound to its attempt and project.
INSERT INTO cancellation_dispatches (run_id, attempt_id, project_id, status, version, dispatch_count,
  next_attempt_at_ms, created_at_ms, updated_at_ms)
VALUES (:run_id, :attempt_id, :project_id, 'pending', 0, 0, :next_attempt_at_ms, :now, :now)

-- name: cancel_dispatch_lease
-- desc: Leases a due cancellation dispatch to a claimer and counts the dispatch, CAS on version.
UPDATE cancellation_dispatches SET status = 'leased', version = version + 1, dispatch_count = dispatch_count + 1,
  next_attempt_at_ms = NULL, lease_owner = :owner, lease_token_digest = :lease_token_digest,
  lease_expires_at_ms = :lease_expires_at_ms, updated_at_ms = :now
WHERE run_id = :run_id AND version = :expected_version AND status IN ('pending', 'retry_wait', 'leased')

-- name: cancel_dispatch_settle
-- desc: Records a leased dispatch's result and next state (done, retry wait, blocked), CAS on version.
UPDATE cancellation_dispatches SET status = :status, version = version + 1, next_attempt_at_ms = :next_attempt_at_ms,
  lease_owner = NULL, lease_token_digest = NULL, lease_expires_at_ms = NULL, last_result = :result,
  last_dispatched_at_ms = :last_dispatched_at_ms, updated_at_ms = :now
WHERE run_id = :run_id AND version = :expected_version AND status = 'leased'

-- name: cancel_dispatch_rearm
-- desc: Operator rearm: moves a blocked dispatch to retry wait, CAS on version and its last result.
UPDATE cancellation_dispatches SET status = 'retry_wait', version = version + 1,
  next_attempt_at_ms = :next_attempt_at_ms, updated_at_ms = :now
WHERE run_id = :run_id AND project_id = :project_id AND version = :expected_version AND status = 'blocked'
  AND last_result = :expected_last_result

-- name: cancel_active_attempts
-- desc: A run's non-terminal attempts (at most two, to detect more than one), for a cancel to target.
SELECT * FROM run_attempts WHERE run_id = :run_id AND status IN ('claimed', 'starting', 'running')
ORDER BY attempt LIMIT 2

-- name: cancel_intent_first
-- desc: The first page of live runs with a cancel intent whose dispatch is missing, due or expired.
SELECT r.id AS run_id, r.cancel_requested_at_ms FROM runs r
LEFT JOIN cancellation_dispatches d ON d.run_id = r.id
WHERE r.cancel_requested_at_ms IS NOT NULL
  AND r.status IN ('created', 'queued', 'dispatching', 'running', 'waiting_approval', 'retry_wait', 'lost')
  AND (d.run_id IS NULL
       OR (d.status IN ('pending', 'retry_wait') AND d.next_attempt_at_ms <= :now)
       OR (d.status = 'leased' AND d.lease_expires_at_ms <= :now))
ORDER BY r.cancel_requested_at_ms, r.id LIMIT :limit

-- name: cancel_intent_after
-- desc: The next page of cancel intents to dispatch, after the (cancel_requested_at_ms, id) cursor.
SELECT r.id AS run_id, r.cancel_requested_at_ms FROM runs r
LEFT JOIN cancellation_dispatches d ON d.run_id = r.id
WHERE r.cancel_requested_at_ms IS NOT NULL
  AND r.status IN ('created', 'queued', 'dispatching', 'running', 'waiting_approval', 'retry_wait', 'lost')
  AND (r.cancel_requested_at_ms > :c_ms OR (r.cancel_requested_at_ms = :c_ms AND r.id > :c_id))
  AND (d.run_id IS NULL
       OR (d.status IN ('pending', 'retry_wait') AND d.next_attempt_at_ms <= :now)
       OR (d.status = 'leased' AND d.lease_expires_at_ms <= :now))
ORDER BY r.cancel_requested_at_ms, r.id LIMIT :limit

-- name: cancel_timeout_page
-- desc: A page of started attempts past their deadline and not yet cancelled, for timeout intents.
SELECT a.id AS attempt_id, a.run_id, r.project_id, a.deadline_at_ms FROM run_attempts a
JOIN runs r ON r.id = a.run_id
WHERE a.status IN ('starting', 'running') AND a.deadline_at_ms IS NOT NULL AND a.deadline_at_ms <= :now
  AND r.cancel_requested_at_ms IS NULL
  AND NOT EXISTS (SELECT 1 FROM parked_items k WHERE k.item_kind = 'timeout' AND k.item_key = r.id
    AND k.next_retry_at_ms > :now)
ORDER BY a.deadline_at_ms, a.id LIMIT :limit

-- name: cancel_summary_counts
-- desc: A project's live cancellation dispatches counted by status and last result, with due, expired, oldest blocked.
SELECT d.status, d.last_result, count(*) AS n,
  sum(CASE WHEN d.status IN ('pending', 'retry_wait') AND d.next_attempt_at_ms <= :now THEN 1 ELSE 0 END) AS due,
  sum(CASE WHEN d.status = 'leased' AND d.lease_expires_at_ms <= :now THEN 1 ELSE 0 END) AS expired,
  min(CASE WHEN d.status = 'blocked' THEN d.updated_at_ms END) AS oldest_blocked
FROM cancellation_dispatches d
JOIN runs r ON r.project_id = d.project_id AND r.id = d.run_id
WHERE d.project_id = :project_id
  AND r.status NOT IN ('succeeded', 'failed', 'cancelled', 'timed_out')
GROUP BY d.status, d.last_result
ORDER BY d.status, d.last_result LIMIT 64

-- name: cancel_blocked_first
-- desc: The first page of a project's blocked dispatches of live runs, blocked up to the snapshot time.
SELECT d.run_id, d.updated_at_ms FROM cancellation_dispatches d
JOIN runs r ON r.project_id = d.project_id AND r.id = d.run_id
WHERE d.project_id = :project_id AND d.status = 'blocked' AND d.updated_at_ms <= :snapshot_at_ms
  AND r.status NOT IN ('succeeded', 'failed', 'cancelled', 'timed_out')
ORDER BY d.updated_at_ms, d.run_id LIMIT :limit

-- name: cancel_blocked_after
-- desc: The next page of a project's blocked dispatches, after the (updated_at_ms, run_id) cursor.
SELECT d.run_id, d.updated_at_ms FROM cancellation_dispatches d
JOIN runs r ON r.project_id = d.project_id AND r.id = d.run_id
WHERE d.project_id = :project_id AND d.status = 'blocked' AND d.updated_at_ms <= :snapshot_at_ms
  AND (d.updated_at_ms > :c_blocked_at_ms OR (d.updated_at_ms = :c_blocked_at_ms AND d.run_id > :c_run_id))
  AND r.status NOT IN ('succeeded', 'failed', 'cancelled', 'timed_out')
ORDER BY d.updated_at_ms, d.run_id LIMIT :limit

-- name: cancel_audit_insert
-- desc: Appends an audit row for a cancellation management operation (cancel, rearm) by a principal.
INSERT INTO cancellation_audit (id, project_id, run_id, principal_id, operation, mutation_id, created_at_ms,
  payload_json)
VALUES (:id, :project_id, :run_id, :principal_id, :operation, :mutation_id, :now, :payload_json)

-- name: cancel_audit_by_mutation
-- desc: The audit row of a management operation by mutation id, so a retried request replays its answer.
SELECT * FROM cancellation_audit WHERE project_id = :project_id AND operation = :operation
  AND mutation_id = :mutation_id

-- name: cancel_event_by_dedupe
-- desc: A run event by its dedupe key, so a repeated cancellation step does not record its event twice.
SELECT * FROM run_events WHERE run_id = :run_id AND dedupe_key = :dedupe_key

-- name: cancel_next_wake
-- desc: The earliest attempt deadline, due dispatch and dispatch lease expiry: when the supervisor must wake.
SELECT
  (SELECT min(a.deadline_at_ms) FROM run_attempts a JOIN runs r ON r.id = a.run_id
   WHERE a.status IN ('starting', 'running') AND a.deadline_at_ms IS NOT NULL
     AND r.cancel_requested_at_ms IS NULL) AS next_deadline_ms,
  (SELECT min(d.next_attempt_at_ms) FROM cancellation_dispatches d JOIN runs r ON r.id = d.run_id
   WHERE d.status IN ('pending', 'retry_wait')
     AND r.status NOT IN ('succeeded', 'failed', 'cancelled', 'timed_out')) AS next_dispatch_ms,
  (SELECT min(d.lease_expires_at_ms) FROM cancellation_dispatches d JOIN runs r ON r.id = d.run_id
   WHERE d.status = 'leased' AND r.status NOT IN ('succeeded', 'failed', 'cancelled', 'timed_out'))
    AS next_lease_ms

-- The same for a supervisor that signals only its own worker's processes: another server's dispatch
-- that is due (that server is down) must not wake it over and over. Deadlines stay global: any
-- server may commit a timeout intent.
-- name: cancel_next_wake_for_worker
-- desc: The supervisor's next wake for one worker: global deadlines, but only that worker's dispatches.
SELECT
  (SELECT min(a.deadline_at_ms) FROM run_attempts a JOIN runs r ON r.id = a.run_id
   WHERE a.status IN ('starting', 'running') AND a.deadline_at_ms IS NOT NULL
     AND r.cancel_requested_at_ms IS NULL) AS next_deadline_ms,
  (SELECT min(d.next_attempt_at_ms) FROM cancellation_dispatches d JOIN runs r ON r.id = d.run_id
   JOIN run_attempts a ON a.id = d.attempt_id
   WHERE d.status IN ('pending', 'retry_wait') AND a.worker_id = :worker_id
     AND r.status NOT IN ('succeeded', 'failed', 'cancelled', 'timed_out')) AS next_dispatch_ms,
  (SELECT min(d.lease_expires_at_ms) FROM cancellation_dispatches d JOIN runs r ON r.id = d.run_id
   JOIN run_attempts a ON a.id = d.attempt_id
   WHERE d.status = 'leased' AND a.worker_id = :worker_id
     AND r.status NOT IN ('succeeded', 'failed', 'cancelled', 'timed_out')) AS next_lease_ms

-- Stops this server's worker began whose Run has since ended while the dispatch is still leased: a
-- crash between the TERM and the KILL after the grace (docs/reliability.md). ``since``: the start of
-- this supervisor, so a lease taken before it belongs to a previous incarnation.
-- name: cancel_interrupted_stops
-- desc: Leased stops of this worker whose run already ended, left by a crash inside the grace; to finish them.
SELECT d.run_id, d.version, a.executor_handle, a.pid FROM cancellation_dispatches d
JOIN runs r ON r.id = d.run_id
JOIN run_attempts a ON a.id = d.attempt_id
WHERE d.status = 'leased' AND r.status IN ('succeeded', 'failed', 'cancelled', 'timed_out')
  AND a.worker_id = :worker_id AND (d.lease_expires_at_ms <= :now OR d.updated_at_ms < :since)
ORDER BY d.run_id LIMIT :limit
