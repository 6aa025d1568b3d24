-- PostgreSQL overrides. Fixed lock order: Run -> Attempt -> lease/dispatch rows.

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
