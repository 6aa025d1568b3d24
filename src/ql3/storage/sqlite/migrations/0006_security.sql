-- Token lifecycle (expiry, rotation, last use; revocation reuses principals.disabled_at_ms) and the
-- per-database key of the task content digest shown to viewers.
ALTER TABLE principals ADD COLUMN expires_at_ms INTEGER;
ALTER TABLE principals ADD COLUMN token_issued_at_ms INTEGER;
ALTER TABLE principals ADD COLUMN last_used_at_ms INTEGER;
UPDATE principals SET token_issued_at_ms = created_at_ms;

CREATE TABLE server_keys (
  name TEXT PRIMARY KEY,
  key_hex TEXT NOT NULL CHECK (length(key_hex) >= 64),
  created_at_ms INTEGER NOT NULL
);
INSERT INTO server_keys (name, key_hex, created_at_ms)
VALUES ('task_digest', lower(hex(randomblob(32))), CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER));
