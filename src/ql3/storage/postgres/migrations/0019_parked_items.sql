-- Parked items (docs/operations.md "Parked items"): an item a control loop failed to handle with a
-- non-transient error, skipped until its retry time so that the loop goes on with the others. One row
-- per (item_kind, item_key); a success deletes it. Bounded per loop by the application (the oldest
-- row is evicted past the cap; a row whose retry time passed long ago without a retry is dropped).
CREATE TABLE parked_items (
  item_kind TEXT NOT NULL CHECK (length(item_kind) BETWEEN 1 AND 32),
  item_key TEXT NOT NULL CHECK (length(item_key) BETWEEN 1 AND 128),
  loop TEXT NOT NULL CHECK (length(loop) BETWEEN 1 AND 32),
  project_id TEXT CHECK (project_id IS NULL OR length(project_id) BETWEEN 1 AND 64),
  reason TEXT NOT NULL CHECK (length(reason) BETWEEN 1 AND 64),
  error_type TEXT CHECK (error_type IS NULL OR length(error_type) BETWEEN 1 AND 64),
  failures INTEGER NOT NULL CHECK (failures >= 1),
  first_failed_at_ms BIGINT NOT NULL,
  last_failed_at_ms BIGINT NOT NULL,
  next_retry_at_ms BIGINT NOT NULL,
  PRIMARY KEY (item_kind, item_key)
);
CREATE INDEX parked_items_loop ON parked_items (loop, last_failed_at_ms, item_kind, item_key);
CREATE INDEX parked_items_project ON parked_items (project_id, last_failed_at_ms) WHERE project_id IS NOT NULL;
