-- PostgreSQL overrides of src/ql3/storage/sql/logs.sql.

-- A row lock: concurrent appends of one attempt (retries on two replicas) run one after the other.
-- name: attempt_log_lock
SELECT * FROM attempt_logs WHERE attempt_id = :attempt_id FOR UPDATE
