-- PostgreSQL overrides of src/ql3/storage/sql/logs.sql.

-- A row lock: concurrent appends of one attempt (retries on two replicas) run one after the other.
-- name: attempt_log_lock
-- desc: An attempt's log head, row-locked so appends of one attempt from two replicas run one at a time.
SELECT * FROM attempt_logs WHERE attempt_id = :attempt_id FOR UPDATE
