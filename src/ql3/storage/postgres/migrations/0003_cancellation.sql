-- Durable cancellation dispatch (ADR-0005/0458/0461): one claim/backoff row per Run, bound forever to
-- one Attempt, scoped to its Project by a composite key; plus the audit trail of manual rearms.
CREATE TABLE cancellation_dispatches (
  run_id TEXT PRIMARY KEY,
  attempt_id TEXT NOT NULL REFERENCES run_attempts (id),
  project_id TEXT NOT NULL,
  status TEXT NOT NULL CHECK (status IN ('pending', 'leased', 'retry_wait', 'dispatched', 'blocked')),
  version INTEGER NOT NULL CHECK (version >= 0),
  dispatch_count INTEGER NOT NULL CHECK (dispatch_count >= 0),
  next_attempt_at_ms BIGINT,
  lease_owner TEXT CHECK (lease_owner IS NULL OR length(lease_owner) BETWEEN 1 AND 128),
  lease_token_digest TEXT CHECK (lease_token_digest IS NULL OR length(lease_token_digest) = 64),
  lease_expires_at_ms BIGINT,
  last_result TEXT CHECK (last_result IS NULL OR last_result IN (
    'controller_missing', 'handle_missing', 'dispatch_error',
    'identity_mismatch', 'pid_mismatch', 'unsupported', 'invalid',
    'termination_requested', 'already_exited')),
  last_dispatched_at_ms BIGINT,
  created_at_ms BIGINT NOT NULL,
  updated_at_ms BIGINT NOT NULL,
  FOREIGN KEY (project_id, run_id) REFERENCES runs (project_id, id),
  CHECK (version >= dispatch_count),
  -- all three lease fields present <=> leased (and none of them otherwise)
  CHECK ((status = 'leased' AND lease_owner IS NOT NULL AND lease_token_digest IS NOT NULL
          AND lease_expires_at_ms IS NOT NULL)
      OR (status <> 'leased' AND lease_owner IS NULL AND lease_token_digest IS NULL
          AND lease_expires_at_ms IS NULL)),
  -- next_attempt_at required for pending/retry_wait, forbidden otherwise
  CHECK ((status IN ('pending', 'retry_wait') AND next_attempt_at_ms IS NOT NULL)
      OR (status NOT IN ('pending', 'retry_wait') AND next_attempt_at_ms IS NULL)),
  -- pending = v0, count 0, no result; every other status has been claimed at least once
  CHECK ((status = 'pending' AND version = 0 AND dispatch_count = 0 AND last_result IS NULL)
      OR (status <> 'pending' AND dispatch_count >= 1)),
  CHECK (status <> 'dispatched' OR last_result IN ('termination_requested', 'already_exited')),
  CHECK (status <> 'blocked' OR last_result IN ('identity_mismatch', 'pid_mismatch', 'unsupported', 'invalid')),
  -- retry_wait carries a retryable result, or a blocking one after a manual rearm
  CHECK (status <> 'retry_wait' OR last_result IN ('controller_missing', 'handle_missing', 'dispatch_error',
    'identity_mismatch', 'pid_mismatch', 'unsupported', 'invalid')),
  CHECK (status <> 'leased' OR last_result IS NULL OR last_result NOT IN ('termination_requested', 'already_exited'))
);
-- Blocked drill-down: Project-scoped keyset (blockedAtMs = updated_at_ms, run_id), never a cross-tenant scan.
CREATE INDEX cancellation_dispatches_blocked ON cancellation_dispatches (project_id, updated_at_ms, run_id)
  WHERE status = 'blocked';
-- Due claims and the per-Project summary.
CREATE INDEX cancellation_dispatches_due ON cancellation_dispatches (status, next_attempt_at_ms, run_id);
CREATE INDEX cancellation_dispatches_project ON cancellation_dispatches (project_id, status);

-- The supervisor's source: live Runs with a cancel intent, by (cancel_requested_at_ms, id).
CREATE INDEX runs_live_cancel_intent ON runs (cancel_requested_at_ms, id)
  WHERE cancel_requested_at_ms IS NOT NULL
    AND status IN ('created', 'queued', 'dispatching', 'running', 'waiting_approval', 'retry_wait', 'lost');

CREATE TABLE cancellation_audit (
  id TEXT PRIMARY KEY,
  project_id TEXT NOT NULL REFERENCES projects (id),
  run_id TEXT NOT NULL,
  principal_id TEXT NOT NULL,
  operation TEXT NOT NULL CHECK (operation IN ('cancellation.rearm')),
  mutation_id TEXT NOT NULL,
  created_at_ms BIGINT NOT NULL,
  payload_json TEXT NOT NULL,
  FOREIGN KEY (project_id, run_id) REFERENCES runs (project_id, id),
  UNIQUE (project_id, operation, mutation_id)
);
CREATE INDEX cancellation_audit_run ON cancellation_audit (run_id, created_at_ms);
