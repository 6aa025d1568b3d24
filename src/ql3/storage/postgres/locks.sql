-- dialect-only: the locked reads, which have no shared text: SELECT ... FOR UPDATE here, a plain read on SQLite.
-- Fixed lock order: Run -> Attempt -> lease/dispatch rows (CancellationDispatch after the Attempt);
-- for approvals: approval -> execution -> recovery control.

-- name: run_lock
SELECT * FROM runs WHERE id = :id FOR UPDATE

-- name: attempt_lock
SELECT * FROM run_attempts WHERE id = :id FOR UPDATE

-- name: lease_lock
SELECT * FROM run_leases WHERE attempt_id = :attempt_id FOR UPDATE

-- name: worker_lock
SELECT * FROM workers WHERE worker_id = :worker_id FOR UPDATE

-- name: schedule_lock
SELECT * FROM task_schedules WHERE task_id = :task_id FOR UPDATE

-- name: cancel_dispatch_lock
SELECT * FROM cancellation_dispatches WHERE run_id = :run_id FOR UPDATE

-- name: approval_lock
SELECT * FROM approval_requests WHERE id = :id FOR UPDATE

-- name: aa_execution_lock
SELECT * FROM approved_action_executions WHERE dispatch_id = :dispatch_id FOR UPDATE

-- name: aa_recovery_lock
SELECT * FROM approved_action_recovery WHERE dispatch_id = :dispatch_id FOR UPDATE
