-- PostgreSQL locked reads for approvals. Lock order: approval -> execution -> recovery control.

-- name: approval_lock
SELECT * FROM approval_requests WHERE id = :id FOR UPDATE

-- name: aa_execution_lock
SELECT * FROM approved_action_executions WHERE dispatch_id = :dispatch_id FOR UPDATE

-- name: aa_recovery_lock
SELECT * FROM approved_action_recovery WHERE dispatch_id = :dispatch_id FOR UPDATE
