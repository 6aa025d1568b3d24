-- Execution: worker sessions, fenced run leases, retry policies and log artifacts.
CREATE TABLE workers (
  worker_id TEXT PRIMARY KEY,
  session_id TEXT NOT NULL,
  generation INTEGER NOT NULL CHECK (generation >= 1),
  status TEXT NOT NULL CHECK (status IN ('online', 'draining', 'offline')),
  version INTEGER NOT NULL CHECK (version >= 0),
  capabilities_json TEXT NOT NULL,
  capabilities_hash TEXT NOT NULL,
  max_concurrent_runs INTEGER NOT NULL CHECK (max_concurrent_runs BETWEEN 1 AND 1024),
  -- leases in status 'leased' held by this worker, kept in the same transactions as the leases
  active_leases INTEGER NOT NULL DEFAULT 0 CHECK (active_leases >= 0),
  session_lease_ms INTEGER NOT NULL,
  registered_at_ms INTEGER NOT NULL,
  last_heartbeat_at_ms INTEGER NOT NULL,
  lease_expires_at_ms INTEGER NOT NULL,
  updated_at_ms INTEGER NOT NULL
);
CREATE INDEX workers_status ON workers (status, worker_id);

CREATE TABLE run_leases (
  attempt_id TEXT PRIMARY KEY REFERENCES run_attempts (id),
  run_id TEXT NOT NULL REFERENCES runs (id),
  status TEXT NOT NULL CHECK (status IN ('leased', 'released', 'completed')),
  version INTEGER NOT NULL CHECK (version >= 0),
  lease_generation INTEGER NOT NULL CHECK (lease_generation >= 1),
  worker_id TEXT NOT NULL,
  worker_session_id TEXT NOT NULL,
  worker_generation INTEGER NOT NULL,
  lease_token_digest TEXT NOT NULL,
  acquired_at_ms INTEGER NOT NULL,
  renewed_at_ms INTEGER NOT NULL,
  expires_at_ms INTEGER NOT NULL,
  released_at_ms INTEGER,
  release_reason TEXT CHECK (release_reason IN ('declined', 'shutdown', 'start_failed', 'capacity_changed', 'lease_expired')),
  completed_at_ms INTEGER,
  updated_at_ms INTEGER NOT NULL,
  CHECK (expires_at_ms > renewed_at_ms AND renewed_at_ms >= acquired_at_ms),
  CHECK ((status = 'leased' AND released_at_ms IS NULL AND release_reason IS NULL AND completed_at_ms IS NULL)
      OR (status = 'released' AND released_at_ms IS NOT NULL AND release_reason IS NOT NULL AND completed_at_ms IS NULL)
      OR (status = 'completed' AND completed_at_ms IS NOT NULL AND released_at_ms IS NULL AND release_reason IS NULL))
);
CREATE INDEX run_leases_expiry ON run_leases (status, expires_at_ms, attempt_id);
CREATE INDEX run_leases_worker ON run_leases (worker_id, status);

CREATE TABLE run_retry_policies (
  run_id TEXT PRIMARY KEY REFERENCES runs (id),
  max_attempts INTEGER NOT NULL CHECK (max_attempts BETWEEN 1 AND 16),
  retry_on_lost INTEGER NOT NULL CHECK (retry_on_lost IN (0, 1)),
  safety TEXT NOT NULL CHECK (safety IN ('unknown', 'idempotent', 'deduplicated')),
  backoff_min_ms INTEGER NOT NULL,
  backoff_max_ms INTEGER NOT NULL,
  next_retry_at_ms INTEGER,
  version INTEGER NOT NULL CHECK (version >= 0),
  CHECK (NOT (retry_on_lost = 1 AND safety = 'unknown'))
);
CREATE INDEX run_retry_due ON run_retry_policies (next_retry_at_ms) WHERE next_retry_at_ms IS NOT NULL;

-- Exactly the candidate filter and order, so a page is an index range read whatever the backlog.
CREATE INDEX runs_dispatch_candidates ON runs (priority DESC, queued_at_ms, id)
  WHERE status = 'queued' AND cancel_requested_at_ms IS NULL;
