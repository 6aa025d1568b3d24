-- dialect-only: the pages have no shared text. PostgreSQL: a page of run ids arrives as one JSON array,
-- matched as `= ANY(ARRAY(...))`: a key lookup per id whatever the table holds (`IN (SELECT ...)` over
-- the array let the planner, which cannot see its size, scan a whole table of history instead).

-- name: retention_attempt_ids
-- desc: The attempt ids of a page of runs (a JSON array), to delete their leases and logs.
SELECT id FROM run_attempts WHERE run_id = ANY(ARRAY(SELECT jsonb_array_elements_text(CAST(:ids AS jsonb)))) ORDER BY id LIMIT 10000

-- name: retention_delete_run_leases
-- desc: Deletes the lease rows of a page of attempts (a JSON array).
DELETE FROM run_leases WHERE attempt_id = ANY(ARRAY(SELECT jsonb_array_elements_text(CAST(:attempt_ids AS jsonb))))

-- name: retention_delete_cancellation_audit
-- desc: Deletes the cancellation audit rows of a page of runs (a JSON array).
DELETE FROM cancellation_audit WHERE run_id = ANY(ARRAY(SELECT jsonb_array_elements_text(CAST(:ids AS jsonb))))

-- name: retention_delete_cancellation_dispatches
-- desc: Deletes the cancellation dispatches of a page of runs (a JSON array).
DELETE FROM cancellation_dispatches WHERE run_id = ANY(ARRAY(SELECT jsonb_array_elements_text(CAST(:ids AS jsonb))))

-- name: retention_delete_run_retry_policies
-- desc: Deletes the retry policies of a page of runs (a JSON array).
DELETE FROM run_retry_policies WHERE run_id = ANY(ARRAY(SELECT jsonb_array_elements_text(CAST(:ids AS jsonb))))

-- name: retention_delete_run_events
-- desc: Deletes the events of a page of runs (a JSON array).
DELETE FROM run_events WHERE run_id = ANY(ARRAY(SELECT jsonb_array_elements_text(CAST(:ids AS jsonb))))

-- name: retention_delete_run_attempts
-- desc: Deletes the attempts of a page of runs (a JSON array).
DELETE FROM run_attempts WHERE run_id = ANY(ARRAY(SELECT jsonb_array_elements_text(CAST(:ids AS jsonb))))

-- name: retention_delete_runs
-- desc: Deletes a page of runs (a JSON array), only those in a terminal status.
DELETE FROM runs WHERE id = ANY(ARRAY(SELECT jsonb_array_elements_text(CAST(:ids AS jsonb)))) AND status IN ('succeeded', 'failed', 'cancelled', 'timed_out')

-- name: retention_delete_log_chunks
-- desc: Deletes a bounded page of shipped log chunks of a page of attempts (a JSON array).
DELETE FROM attempt_log_chunks WHERE (attempt_id, start_offset) IN (
  SELECT attempt_id, start_offset FROM attempt_log_chunks
  WHERE attempt_id = ANY(ARRAY(SELECT jsonb_array_elements_text(CAST(:attempt_ids AS jsonb))))
  ORDER BY attempt_id, start_offset LIMIT :limit)

-- name: retention_delete_attempt_logs
-- desc: Deletes the shipped-log heads of a page of attempts (a JSON array).
DELETE FROM attempt_logs WHERE attempt_id = ANY(ARRAY(SELECT jsonb_array_elements_text(CAST(:attempt_ids AS jsonb))))
