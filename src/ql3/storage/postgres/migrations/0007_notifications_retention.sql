-- Notifications (channels, rules, a transactional outbox) and retention policies (docs/notifications.md,
-- docs/retention.md). Channel targets and secrets are write-only: no query returns them to a client.
CREATE TABLE notification_channels (
  id TEXT PRIMARY KEY,
  project_id TEXT NOT NULL REFERENCES projects (id),
  name TEXT NOT NULL CHECK (length(name) BETWEEN 1 AND 64),
  kind TEXT NOT NULL CHECK (kind IN ('webhook', 'apprise')),
  target TEXT NOT NULL CHECK (length(target) BETWEEN 1 AND 2048),
  secret TEXT CHECK (secret IS NULL OR length(secret) BETWEEN 16 AND 256),
  scheme TEXT NOT NULL CHECK (length(scheme) BETWEEN 1 AND 32),
  created_at_ms BIGINT NOT NULL,
  UNIQUE (project_id, name),
  CHECK ((kind = 'webhook' AND secret IS NOT NULL) OR (kind = 'apprise' AND secret IS NULL))
);
-- task_id '' means every task of the project; events is a sorted comma-separated set.
CREATE TABLE notification_rules (
  id TEXT PRIMARY KEY,
  project_id TEXT NOT NULL REFERENCES projects (id),
  channel_id TEXT NOT NULL REFERENCES notification_channels (id),
  task_id TEXT NOT NULL,
  events TEXT NOT NULL CHECK (length(events) BETWEEN 1 AND 256),
  created_at_ms BIGINT NOT NULL
);
CREATE INDEX notification_rules_project ON notification_rules (project_id, channel_id);
-- One row per (channel, outcome): the unique key makes a second enqueue of one outcome a no-op.
-- due_at_ms is when the row may be claimed: the next attempt for pending, the lease expiry for leased.
CREATE TABLE notification_outbox (
  id TEXT PRIMARY KEY,
  project_id TEXT NOT NULL REFERENCES projects (id),
  channel_id TEXT NOT NULL,
  outcome_key TEXT NOT NULL CHECK (length(outcome_key) BETWEEN 1 AND 256),
  event TEXT NOT NULL,
  payload_json TEXT NOT NULL CHECK (length(payload_json) <= 4096),
  status TEXT NOT NULL CHECK (status IN ('pending', 'leased', 'delivered', 'dead')),
  attempts INTEGER NOT NULL CHECK (attempts >= 0),
  due_at_ms BIGINT,
  lease_owner TEXT CHECK (lease_owner IS NULL OR length(lease_owner) BETWEEN 1 AND 128),
  last_error TEXT CHECK (last_error IS NULL OR length(last_error) <= 64),
  created_at_ms BIGINT NOT NULL,
  updated_at_ms BIGINT NOT NULL,
  UNIQUE (channel_id, outcome_key),
  CHECK ((status IN ('pending', 'leased')) = (due_at_ms IS NOT NULL)),
  CHECK ((status = 'leased') = (lease_owner IS NOT NULL))
);
CREATE INDEX notification_outbox_due ON notification_outbox (due_at_ms, id) WHERE due_at_ms IS NOT NULL;
CREATE INDEX notification_outbox_settled ON notification_outbox (updated_at_ms, id)
  WHERE due_at_ms IS NULL;
CREATE TABLE retention_policies (
  project_id TEXT PRIMARY KEY REFERENCES projects (id),
  keep_days INTEGER CHECK (keep_days IS NULL OR keep_days BETWEEN 1 AND 36500),
  runs_per_task INTEGER CHECK (runs_per_task IS NULL OR runs_per_task BETWEEN 1 AND 100000000),
  log_bytes_per_run BIGINT CHECK (log_bytes_per_run IS NULL OR log_bytes_per_run BETWEEN 1024 AND 1099511627776),
  log_cursor_ms BIGINT NOT NULL DEFAULT 0,
  log_cursor_id TEXT NOT NULL DEFAULT '',
  version INTEGER NOT NULL CHECK (version >= 1),
  updated_at_ms BIGINT NOT NULL
);
-- Metrics read the newest finish per task and outcome, and the runs finished since a cursor.
CREATE INDEX runs_task_outcome ON runs (task_id, status, finished_at_ms);
CREATE INDEX runs_finished ON runs (finished_at_ms, id) WHERE finished_at_ms IS NOT NULL;
-- Deleting a run or an attempt checks the rows that reference it: index every referencing column.
CREATE INDEX run_leases_run ON run_leases (run_id);
CREATE INDEX cancellation_dispatches_attempt ON cancellation_dispatches (attempt_id);
CREATE INDEX cancellation_audit_project_run ON cancellation_audit (project_id, run_id);
CREATE INDEX approved_run_action_receipts_project_run ON approved_run_action_receipts (project_id, resource_id);
-- Retention walks finished attempts (for log caps) in finish order.
CREATE INDEX run_attempts_finished ON run_attempts (finished_at_ms, id) WHERE finished_at_ms IS NOT NULL;
