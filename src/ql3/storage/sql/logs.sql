-- Shipped attempt logs (docs/cluster.md "Log shipping"): a head row per attempt and its chunks,
-- contiguous from offset 0. Reads are keyset pages by offset.

-- The lease of an attempt: who may ship its log (the fence of the log route).
-- name: attempt_log_lease
-- desc: The lease holder of an attempt (worker, session, generation, status): the fence of the log route.
SELECT worker_id, worker_session_id, worker_generation, status FROM run_leases WHERE attempt_id = :attempt_id

-- name: attempt_log_create
-- desc: Creates the log head of an attempt with its byte cap; nothing when it exists.
INSERT INTO attempt_logs (attempt_id, stored_bytes, cap_bytes, created_at_ms, updated_at_ms)
VALUES (:attempt_id, 0, :cap_bytes, :now, :now)
ON CONFLICT (attempt_id) DO NOTHING

-- name: attempt_log_head
-- desc: An attempt's log head (stored bytes, cap, truncation, closed), unlocked.
SELECT * FROM attempt_logs WHERE attempt_id = :attempt_id

-- Serialises the appends of one attempt (PostgreSQL adds FOR UPDATE; SQLite's write lock already does).
-- name: attempt_log_lock
-- desc: An attempt's log head held for the append (a plain read where writes are already serial).
SELECT * FROM attempt_logs WHERE attempt_id = :attempt_id

-- name: attempt_log_chunk_at
-- desc: The chunk stored at an exact offset, so a repeated append can be compared with it.
SELECT data FROM attempt_log_chunks WHERE attempt_id = :attempt_id AND start_offset = :start_offset

-- name: attempt_log_chunk_insert
-- desc: Stores one chunk of an attempt's log at its start offset.
INSERT INTO attempt_log_chunks (attempt_id, start_offset, data, created_at_ms)
VALUES (:attempt_id, :start_offset, :data, :now)

-- name: attempt_log_advance
-- desc: Moves a log head's stored byte count (and truncation), CAS on the expected byte count.
UPDATE attempt_logs SET stored_bytes = :stored_bytes, truncated_at_ms = :truncated_at_ms, updated_at_ms = :now
WHERE attempt_id = :attempt_id AND stored_bytes = :expected_bytes

-- name: attempt_log_close
-- desc: Marks an attempt's log closed once, when its attempt has ended.
UPDATE attempt_logs SET closed_at_ms = :now, updated_at_ms = :now
WHERE attempt_id = :attempt_id AND closed_at_ms IS NULL

-- A page of chunks from the one holding the given offset on (keyset by offset).
-- name: attempt_log_page
-- desc: A page of log chunks from the one holding the given offset onwards, for log reads.
SELECT start_offset, data FROM attempt_log_chunks
WHERE attempt_id = :attempt_id AND start_offset >= COALESCE(
  (SELECT MAX(start_offset) FROM attempt_log_chunks WHERE attempt_id = :attempt_id AND start_offset <= :from_offset), 0)
ORDER BY start_offset LIMIT :limit

-- The schema version the database is at (the highest applied migration), for /readyz.
-- name: schema_applied_version
-- desc: The highest applied migration version, for /readyz.
SELECT COALESCE(MAX(version), 0) AS version FROM ql3_schema_migrations
