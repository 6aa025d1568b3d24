-- SQLite overrides. Writers are serialised by BEGIN IMMEDIATE, so a plain read is a locked read.

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
