-- Token lifecycle (expiry, rotation, last use; revocation reuses principals.disabled_at_ms) and the
-- per-database key of the task content digest shown to viewers.
ALTER TABLE principals ADD COLUMN expires_at_ms BIGINT;
ALTER TABLE principals ADD COLUMN token_issued_at_ms BIGINT;
ALTER TABLE principals ADD COLUMN last_used_at_ms BIGINT;
UPDATE principals SET token_issued_at_ms = created_at_ms;

CREATE TABLE server_keys (
  name TEXT PRIMARY KEY,
  key_hex TEXT NOT NULL CHECK (length(key_hex) >= 64),
  created_at_ms BIGINT NOT NULL
);
-- gen_random_uuid() draws from the server's strong random source: two of them give 244 random bits.
INSERT INTO server_keys (name, key_hex, created_at_ms)
VALUES ('task_digest', replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''),
        ql3_now_ms());
