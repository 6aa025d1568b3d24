-- The digest of the request that created a run under an idempotency key (docs/api.md "Idempotency"):
-- a repeat of the key with a different request is a conflict, not a replay of the first run. NULL for
-- runs without a key and for runs created before this column (a repeat of those is not compared).
ALTER TABLE runs ADD COLUMN request_digest TEXT
  CHECK (request_digest IS NULL OR request_digest ~ '^[0-9a-f]{64}$');
