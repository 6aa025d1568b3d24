-- Cluster log shipping (docs/cluster.md "Log shipping"): a remote worker ships each attempt's log in
-- chunks, stored here so any replica serves it. One head row per attempt holds the stored length,
-- the quota fixed at the first chunk, and whether the quota was reached (readers render the
-- truncation marker after the stored bytes) or the worker closed the log after the attempt settled.
CREATE TABLE attempt_logs (
  attempt_id TEXT PRIMARY KEY REFERENCES run_attempts(id),
  stored_bytes BIGINT NOT NULL CHECK (stored_bytes >= 0),
  cap_bytes BIGINT NOT NULL CHECK (cap_bytes >= 1),
  truncated_at_ms BIGINT,
  closed_at_ms BIGINT,
  created_at_ms BIGINT NOT NULL,
  updated_at_ms BIGINT NOT NULL,
  CHECK (stored_bytes <= cap_bytes),
  CHECK (truncated_at_ms IS NULL OR stored_bytes = cap_bytes)
);
-- The chunks, contiguous from offset 0 (the append checks start_offset = stored_bytes).
CREATE TABLE attempt_log_chunks (
  attempt_id TEXT NOT NULL REFERENCES attempt_logs(attempt_id),
  start_offset BIGINT NOT NULL CHECK (start_offset >= 0),
  data BYTEA NOT NULL CHECK (octet_length(data) BETWEEN 1 AND 65536),
  created_at_ms BIGINT NOT NULL,
  PRIMARY KEY (attempt_id, start_offset)
);
