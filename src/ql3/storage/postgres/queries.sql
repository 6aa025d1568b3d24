-- PostgreSQL overrides. Fixed lock order: Run -> Attempt -> lease/dispatch rows.

-- name: run_lock
SELECT * FROM runs WHERE id = :id FOR UPDATE

-- name: attempt_lock
SELECT * FROM run_attempts WHERE id = :id FOR UPDATE
