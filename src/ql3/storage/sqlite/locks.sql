-- dialect-only: the locked reads, which have no shared text: a plain read here, SELECT ... FOR UPDATE on PostgreSQL.
-- Writers are serialised by BEGIN IMMEDIATE, so a plain read is a locked read.

-- name: run_lock
-- desc: One Run by id; a plain read is a locked read because BEGIN IMMEDIATE serialises writers.
SELECT * FROM runs WHERE id = :id

-- name: attempt_lock
-- desc: One Attempt by id; a plain read is a locked read because BEGIN IMMEDIATE serialises writers.
SELECT * FROM run_attempts WHERE id = :id

-- name: lease_lock
-- desc: An attempt's lease row; a plain read is a locked read because BEGIN IMMEDIATE serialises writers.
SELECT * FROM run_leases WHERE attempt_id = :attempt_id

-- name: worker_lock
-- desc: One worker row; a plain read is a locked read because BEGIN IMMEDIATE serialises writers.
SELECT * FROM workers WHERE worker_id = :worker_id

-- name: schedule_lock
-- desc: A task's schedule row; a plain read is a locked read because BEGIN IMMEDIATE serialises writers.
SELECT * FROM task_schedules WHERE task_id = :task_id

-- name: cancel_dispatch_lock
-- desc: A run's cancellation dispatch; a plain read is a locked read (writers are serialised).
SELECT * FROM cancellation_dispatches WHERE run_id = :run_id

-- name: approval_lock
-- desc: One approval request; a plain read is a locked read because BEGIN IMMEDIATE serialises writers.
SELECT * FROM approval_requests WHERE id = :id

-- name: aa_execution_lock
-- desc: An approved action's execution row; a plain read is a locked read (writers are serialised).
SELECT * FROM approved_action_executions WHERE dispatch_id = :dispatch_id

-- name: aa_recovery_lock
-- desc: An approved action's recovery control; a plain read is a locked read (writers are serialised).
SELECT * FROM approved_action_recovery WHERE dispatch_id = :dispatch_id
