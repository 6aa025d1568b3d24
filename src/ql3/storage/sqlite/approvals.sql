-- SQLite locked reads for approvals: writers are serialised by BEGIN IMMEDIATE, so a plain read is locked.

-- name: approval_lock
SELECT * FROM approval_requests WHERE id = :id

-- name: aa_execution_lock
SELECT * FROM approved_action_executions WHERE dispatch_id = :dispatch_id

-- name: aa_recovery_lock
SELECT * FROM approved_action_recovery WHERE dispatch_id = :dispatch_id
