-- dialect-only: the locked reads, which have no shared text: a plain read here, SELECT ... FOR UPDATE on PostgreSQL.
-- Writers are serialised by BEGIN IMMEDIATE, so a plain read is a locked read.

-- name: run_lock
SELECT * FROM runs WHERE id = :id

-- name: attempt_lock
SELECT * FROM run_attempts WHERE id = :id

-- name: lease_lock
SELECT * FROM run_leases WHERE attempt_id = :attempt_id

-- name: worker_lock
SELECT * FROM workers WHERE worker_id = :worker_id

-- name: schedule_lock
SELECT * FROM task_schedules WHERE task_id = :task_id

-- name: cancel_dispatch_lock
SELECT * FROM cancellation_dispatches WHERE run_id = :run_id

-- name: approval_lock
SELECT * FROM approval_requests WHERE id = :id

-- name: aa_execution_lock
SELECT * FROM approved_action_executions WHERE dispatch_id = :dispatch_id

-- name: aa_recovery_lock
SELECT * FROM approved_action_recovery WHERE dispatch_id = :dispatch_id
