-- Shipped attempt logs (docs/cluster.md "Log shipping"): a head row per attempt and its chunks,
-- contiguous from offset 0. Reads are keyset pages by offset.

-- The lease of an attempt: who may ship its log (the fence of the log route).
-- name: attempt_log_lease
SELECT worker_id, worker_session_id, worker_generation, status FROM run_leases WHERE attempt_id = :attempt_id

-- name: attempt_log_create
INSERT INTO attempt_logs (attempt_id, stored_bytes, cap_bytes, created_at_ms, updated_at_ms)
VALUES (:attempt_id, 0, :cap_bytes, :now, :now)
ON CONFLICT (attempt_id) DO NOTHING

-- name: attempt_log_head
SELECT * FROM attempt_logs WHERE attempt_id = :attempt_id

-- Serialises the appends of one attempt (PostgreSQL adds FOR UPDATE; SQLite's write lock already does).
-- name: attempt_log_lock
SELECT * FROM attempt_logs WHERE attempt_id = :attempt_id

-- name: attempt_log_chunk_at
SELECT data FROM attempt_log_chunks WHERE attempt_id = :attempt_id AND start_offset = :start_offset

-- name: attempt_log_chunk_insert
INSERT INTO attempt_log_chunks (attempt_id, start_offset, data, created_at_ms)
VALUES (:attempt_id, :start_offset, :data, :now)

-- name: attempt_log_advance
UPDATE attempt_logs SET stored_bytes = :stored_bytes, truncated_at_ms = :truncated_at_ms, updated_at_ms = :now
WHERE attempt_id = :attempt_id AND stored_bytes = :expected_bytes

-- name: attempt_log_close
UPDATE attempt_logs SET closed_at_ms = :now, updated_at_ms = :now
WHERE attempt_id = :attempt_id AND closed_at_ms IS NULL

-- A page of chunks from the one holding the given offset on (keyset by offset).
-- name: attempt_log_page
SELECT start_offset, data FROM attempt_log_chunks
WHERE attempt_id = :attempt_id AND start_offset >= COALESCE(
  (SELECT MAX(start_offset) FROM attempt_log_chunks WHERE attempt_id = :attempt_id AND start_offset <= :from_offset), 0)
ORDER BY start_offset LIMIT :limit

-- The schema version the database is at (the highest applied migration), for /readyz.
-- name: schema_applied_version
SELECT COALESCE(MAX(version), 0) AS version FROM ql3_schema_migrations
