-- Approvals and approved actions (ADR-0031..0034): the request, its immutable dispatch, the mutable
-- execution control behind the durable start barrier, recovery control and resolutions, and the
-- run.create receipt. Every state's shape is a CHECK here, so no writer can store an impossible row.
-- Nullable columns are always guarded with IS [NOT] NULL inside a branch: a NULL comparison would make
-- a CHECK pass silently.
CREATE TABLE approval_requests (
  id TEXT PRIMARY KEY CHECK (length(id) BETWEEN 1 AND 128),
  project_id TEXT NOT NULL REFERENCES projects (id),
  version INTEGER NOT NULL CHECK (version BETWEEN 1 AND 3),
  state TEXT NOT NULL CHECK (state IN ('pending', 'approved', 'rejected', 'consumed')),
  permission TEXT NOT NULL CHECK (permission IN ('run.create')),
  action_type TEXT NOT NULL CHECK (action_type GLOB '[a-z]*' AND NOT action_type GLOB '*[^a-z0-9_.]*'
    AND length(action_type) <= 64),
  action_ref TEXT NOT NULL CHECK (length(action_ref) BETWEEN 1 AND 255),
  action_digest TEXT NOT NULL CHECK (length(action_digest) = 64 AND NOT action_digest GLOB '*[^0-9a-f]*'),
  action_plan_json TEXT NOT NULL CHECK (length(action_plan_json) BETWEEN 2 AND 4096),
  preview_digest TEXT NOT NULL CHECK (length(preview_digest) = 64 AND NOT preview_digest GLOB '*[^0-9a-f]*'),
  risk TEXT NOT NULL CHECK (risk IN ('low', 'medium', 'high', 'critical')),
  requested_by TEXT NOT NULL REFERENCES principals (id),
  requested_at_ms INTEGER NOT NULL,
  expires_at_ms INTEGER NOT NULL,
  request_fence TEXT NOT NULL,
  request_digest TEXT NOT NULL CHECK (length(request_digest) = 64 AND NOT request_digest GLOB '*[^0-9a-f]*'),
  decision_id TEXT CHECK (decision_id IS NULL OR length(decision_id) BETWEEN 1 AND 128),
  decision TEXT CHECK (decision IS NULL OR decision IN ('approve', 'reject')),
  reason_code TEXT CHECK (reason_code IS NULL OR (reason_code GLOB '[a-z]*'
    AND NOT reason_code GLOB '*[^a-z0-9_]*' AND length(reason_code) <= 64)),
  decided_by TEXT REFERENCES principals (id),
  decided_at_ms INTEGER,
  decision_fence TEXT,
  consumption_id TEXT UNIQUE CHECK (consumption_id IS NULL OR length(consumption_id) BETWEEN 1 AND 128),
  dispatch_id TEXT UNIQUE,
  consumed_by TEXT CHECK (consumed_by IS NULL OR consumed_by IN ('system', 'worker')),
  consumed_at_ms INTEGER,
  consumption_fence TEXT,
  updated_at_ms INTEGER NOT NULL,
  UNIQUE (project_id, id),
  -- the lifetime is fixed at request time: at most 24 h, never extended
  CHECK (expires_at_ms > requested_at_ms AND expires_at_ms - requested_at_ms <= 86400000),
  -- each tuple is all-or-nothing
  CHECK ((decision_id IS NULL AND decision IS NULL AND reason_code IS NULL AND decided_by IS NULL
          AND decided_at_ms IS NULL AND decision_fence IS NULL)
      OR (decision_id IS NOT NULL AND decision IS NOT NULL AND reason_code IS NOT NULL AND decided_by IS NOT NULL
          AND decided_at_ms IS NOT NULL AND decision_fence IS NOT NULL)),
  CHECK ((consumption_id IS NULL AND dispatch_id IS NULL AND consumed_by IS NULL AND consumed_at_ms IS NULL
          AND consumption_fence IS NULL)
      OR (consumption_id IS NOT NULL AND dispatch_id IS NOT NULL AND consumed_by IS NOT NULL
          AND consumed_at_ms IS NOT NULL AND consumption_fence IS NOT NULL)),
  -- decisions and consumption happen strictly before expiry; the decider is never the requester
  CHECK (decided_at_ms IS NULL OR (decided_at_ms >= requested_at_ms AND decided_at_ms < expires_at_ms)),
  CHECK (decided_by IS NULL OR decided_by <> requested_by),
  CHECK (consumed_at_ms IS NULL OR (decided_at_ms IS NOT NULL AND consumed_at_ms >= decided_at_ms
    AND consumed_at_ms < expires_at_ms)),
  -- pending@1 -> approved@2 -> consumed@3 | pending@1 -> rejected@2
  CHECK ((state = 'pending' AND version = 1 AND decision_id IS NULL AND consumption_id IS NULL)
      OR (state = 'approved' AND version = 2 AND decision IS NOT NULL AND decision = 'approve'
          AND consumption_id IS NULL)
      OR (state = 'rejected' AND version = 2 AND decision IS NOT NULL AND decision = 'reject'
          AND consumption_id IS NULL)
      OR (state = 'consumed' AND version = 3 AND decision IS NOT NULL AND decision = 'approve'
          AND consumption_id IS NOT NULL))
);
CREATE INDEX approval_requests_project ON approval_requests (project_id, requested_at_ms, id);
CREATE INDEX approval_requests_project_state ON approval_requests (project_id, state, requested_at_ms, id);
CREATE INDEX approval_requests_unconsumed ON approval_requests (decided_at_ms, id) WHERE state = 'approved';

-- Immutable approval evidence: one per consumed approval; execution control lives elsewhere.
CREATE TABLE approved_action_dispatches (
  id TEXT PRIMARY KEY,
  approval_request_id TEXT NOT NULL UNIQUE,
  approval_request_version INTEGER NOT NULL CHECK (approval_request_version = 3),
  project_id TEXT NOT NULL,
  action_type TEXT NOT NULL CHECK (action_type GLOB '[a-z]*' AND NOT action_type GLOB '*[^a-z0-9_.]*'
    AND length(action_type) <= 64),
  action_ref TEXT NOT NULL CHECK (length(action_ref) BETWEEN 1 AND 255),
  action_digest TEXT NOT NULL CHECK (length(action_digest) = 64 AND NOT action_digest GLOB '*[^0-9a-f]*'),
  action_plan_json TEXT NOT NULL CHECK (length(action_plan_json) BETWEEN 2 AND 4096),
  requested_by TEXT NOT NULL,
  consumed_by TEXT NOT NULL CHECK (consumed_by IN ('system', 'worker')),
  approved_by TEXT NOT NULL,
  approved_at_ms INTEGER NOT NULL,
  expires_at_ms INTEGER NOT NULL,
  approval_fence TEXT NOT NULL,
  dispatch_digest TEXT NOT NULL CHECK (length(dispatch_digest) = 64 AND NOT dispatch_digest GLOB '*[^0-9a-f]*'),
  created_at_ms INTEGER NOT NULL,
  UNIQUE (project_id, id),
  FOREIGN KEY (project_id, approval_request_id) REFERENCES approval_requests (project_id, id),
  CHECK (approved_by <> requested_by),
  CHECK (approved_at_ms <= created_at_ms AND created_at_ms < expires_at_ms)
);
CREATE TRIGGER approved_action_dispatches_immutable BEFORE UPDATE ON approved_action_dispatches
BEGIN
  SELECT RAISE(ABORT, 'approved_action_dispatches rows are immutable');
END;

-- The mutable execution control (ADR-0032), 1:1 with the dispatch. Only the lease token's digest.
CREATE TABLE approved_action_executions (
  dispatch_id TEXT PRIMARY KEY,
  dispatch_digest TEXT NOT NULL CHECK (length(dispatch_digest) = 64 AND NOT dispatch_digest GLOB '*[^0-9a-f]*'),
  project_id TEXT NOT NULL,
  status TEXT NOT NULL CHECK (status IN ('pending', 'leased', 'executing', 'retry_wait', 'succeeded', 'failed',
    'blocked')),
  version INTEGER NOT NULL CHECK (version >= 0),
  attempt_count INTEGER NOT NULL CHECK (attempt_count >= 0),
  max_attempts INTEGER NOT NULL CHECK (max_attempts BETWEEN 1 AND 16),
  eligible_at_ms INTEGER,
  next_attempt_at_ms INTEGER,
  lease_owner TEXT CHECK (lease_owner IS NULL OR length(lease_owner) BETWEEN 1 AND 128),
  lease_token_digest TEXT CHECK (lease_token_digest IS NULL OR (length(lease_token_digest) = 64
    AND NOT lease_token_digest GLOB '*[^0-9a-f]*')),
  lease_expires_at_ms INTEGER,
  started_at_ms INTEGER,
  result_mutation_id TEXT CHECK (result_mutation_id IS NULL OR length(result_mutation_id) BETWEEN 1 AND 128),
  result_code TEXT CHECK (result_code IS NULL OR (result_code GLOB '[a-z]*'
    AND NOT result_code GLOB '*[^a-z0-9_]*' AND length(result_code) <= 64)),
  result_digest TEXT CHECK (result_digest IS NULL OR (length(result_digest) = 64
    AND NOT result_digest GLOB '*[^0-9a-f]*')),
  completed_at_ms INTEGER,
  created_at_ms INTEGER NOT NULL,
  updated_at_ms INTEGER NOT NULL,
  execution_digest TEXT NOT NULL CHECK (length(execution_digest) = 64
    AND NOT execution_digest GLOB '*[^0-9a-f]*'),
  FOREIGN KEY (project_id, dispatch_id) REFERENCES approved_action_dispatches (project_id, id),
  UNIQUE (project_id, dispatch_id),
  CHECK (attempt_count <= max_attempts AND version >= attempt_count AND updated_at_ms >= created_at_ms),
  -- a lease is at most 10 minutes ahead of the write that set it
  CHECK (lease_expires_at_ms IS NULL OR (lease_expires_at_ms > updated_at_ms
    AND lease_expires_at_ms <= updated_at_ms + 600000)),
  CHECK (started_at_ms IS NULL OR started_at_ms >= created_at_ms),
  CHECK (
    (status = 'pending' AND version = 0 AND attempt_count = 0 AND eligible_at_ms IS NOT NULL
      AND eligible_at_ms >= created_at_ms AND next_attempt_at_ms IS NULL
      AND lease_owner IS NULL AND lease_token_digest IS NULL AND lease_expires_at_ms IS NULL
      AND started_at_ms IS NULL AND result_mutation_id IS NULL AND result_code IS NULL
      AND result_digest IS NULL AND completed_at_ms IS NULL)
    -- leased: lease set, attempts >= 1, eligible_at == lease expiry (an expired lease is due again), not started
    OR (status = 'leased' AND lease_owner IS NOT NULL AND lease_token_digest IS NOT NULL
      AND lease_expires_at_ms IS NOT NULL AND attempt_count >= 1 AND eligible_at_ms IS NOT NULL
      AND eligible_at_ms = lease_expires_at_ms AND next_attempt_at_ms IS NULL AND started_at_ms IS NULL
      AND result_digest IS NULL AND completed_at_ms IS NULL)
    -- executing: the start barrier is committed; never due again
    OR (status = 'executing' AND lease_owner IS NOT NULL AND lease_token_digest IS NOT NULL
      AND lease_expires_at_ms IS NOT NULL AND attempt_count >= 1 AND eligible_at_ms IS NULL
      AND next_attempt_at_ms IS NULL AND started_at_ms IS NOT NULL AND started_at_ms < lease_expires_at_ms
      AND result_mutation_id IS NULL AND result_code IS NULL AND result_digest IS NULL
      AND completed_at_ms IS NULL)
    OR (status = 'retry_wait' AND lease_owner IS NULL AND lease_token_digest IS NULL
      AND lease_expires_at_ms IS NULL AND attempt_count >= 1 AND attempt_count < max_attempts
      AND next_attempt_at_ms IS NOT NULL AND eligible_at_ms IS NOT NULL AND eligible_at_ms = next_attempt_at_ms
      AND result_code IS NOT NULL AND started_at_ms IS NULL AND result_digest IS NULL
      AND completed_at_ms IS NULL)
    OR (status IN ('succeeded', 'failed', 'blocked') AND lease_owner IS NULL AND lease_token_digest IS NULL
      AND lease_expires_at_ms IS NULL AND eligible_at_ms IS NULL AND next_attempt_at_ms IS NULL
      AND result_code IS NOT NULL AND result_mutation_id IS NOT NULL AND completed_at_ms IS NOT NULL
      AND completed_at_ms = updated_at_ms)
  ),
  CHECK (status <> 'succeeded' OR (started_at_ms IS NOT NULL AND result_digest IS NOT NULL)),
  CHECK (status <> 'failed' OR (started_at_ms IS NOT NULL AND result_digest IS NULL)),
  CHECK (status <> 'blocked' OR result_digest IS NULL)
);
-- The bounded due scan: keyset (eligible_at_ms, dispatch_id); executing and terminal rows have no key.
CREATE INDEX approved_action_executions_due ON approved_action_executions (eligible_at_ms, dispatch_id)
  WHERE eligible_at_ms IS NOT NULL;
CREATE INDEX approved_action_executions_project ON approved_action_executions (project_id, created_at_ms,
  dispatch_id);

-- Recovery control (ADR-0033): armed in the leased -> executing transaction. The resolver lease only
-- coordinates probing; it never grants execution.
CREATE TABLE approved_action_recovery (
  dispatch_id TEXT PRIMARY KEY,
  project_id TEXT NOT NULL,
  status TEXT NOT NULL CHECK (status IN ('armed', 'manual', 'resolved')),
  version INTEGER NOT NULL CHECK (version >= 0),
  execution_version INTEGER NOT NULL CHECK (execution_version >= 1),
  next_scan_at_ms INTEGER,
  resolver_owner TEXT CHECK (resolver_owner IS NULL OR length(resolver_owner) BETWEEN 1 AND 128),
  resolver_token_digest TEXT CHECK (resolver_token_digest IS NULL OR (length(resolver_token_digest) = 64
    AND NOT resolver_token_digest GLOB '*[^0-9a-f]*')),
  resolver_lease_expires_at_ms INTEGER,
  last_finding TEXT CHECK (last_finding IS NULL OR last_finding IN ('verified_succeeded', 'verified_failed',
    'still_running', 'missing', 'conflict', 'unsupported', 'unavailable', 'manual_only', 'completed')),
  scan_count INTEGER NOT NULL CHECK (scan_count >= 0),
  evidence_digest TEXT CHECK (evidence_digest IS NULL OR (length(evidence_digest) = 64
    AND NOT evidence_digest GLOB '*[^0-9a-f]*')),
  resolution_mutation_id TEXT CHECK (resolution_mutation_id IS NULL
    OR length(resolution_mutation_id) BETWEEN 1 AND 128),
  armed_at_ms INTEGER NOT NULL,
  updated_at_ms INTEGER NOT NULL,
  FOREIGN KEY (project_id, dispatch_id) REFERENCES approved_action_executions (project_id, dispatch_id),
  CHECK ((resolver_owner IS NULL AND resolver_token_digest IS NULL AND resolver_lease_expires_at_ms IS NULL)
      OR (resolver_owner IS NOT NULL AND resolver_token_digest IS NOT NULL
          AND resolver_lease_expires_at_ms IS NOT NULL)),
  CHECK ((status = 'armed' AND next_scan_at_ms IS NOT NULL AND resolution_mutation_id IS NULL)
      OR (status = 'manual' AND next_scan_at_ms IS NULL AND resolver_owner IS NULL
          AND resolution_mutation_id IS NULL)
      OR (status = 'resolved' AND next_scan_at_ms IS NULL AND resolver_owner IS NULL
          AND resolution_mutation_id IS NOT NULL))
);
CREATE INDEX approved_action_recovery_due ON approved_action_recovery (next_scan_at_ms, dispatch_id)
  WHERE status = 'armed';

-- Resolutions: unique per dispatch; automatic (verified evidence) or manual (with the authorization fact).
CREATE TABLE approved_action_resolutions (
  dispatch_id TEXT PRIMARY KEY,
  project_id TEXT NOT NULL,
  mutation_id TEXT NOT NULL UNIQUE CHECK (length(mutation_id) BETWEEN 1 AND 128),
  expected_execution_version INTEGER NOT NULL CHECK (expected_execution_version >= 1),
  source TEXT NOT NULL CHECK (source IN ('resolver', 'manual')),
  resolution TEXT NOT NULL CHECK (resolution IN ('verified_succeeded', 'verified_failed', 'confirm_succeeded',
    'confirm_failed', 'abandon_unknown')),
  outcome TEXT NOT NULL CHECK (outcome IN ('succeeded', 'failed', 'blocked')),
  actor_type TEXT NOT NULL CHECK (actor_type IN ('system', 'user')),
  actor_id TEXT NOT NULL CHECK (length(actor_id) BETWEEN 1 AND 128),
  actor_role TEXT CHECK (actor_role IS NULL OR actor_role IN ('approver', 'admin')),
  reason_code TEXT NOT NULL CHECK (reason_code GLOB '[a-z]*' AND NOT reason_code GLOB '*[^a-z0-9_]*'
    AND length(reason_code) <= 64),
  evidence_digest TEXT CHECK (evidence_digest IS NULL OR (length(evidence_digest) = 64
    AND NOT evidence_digest GLOB '*[^0-9a-f]*')),
  created_at_ms INTEGER NOT NULL,
  FOREIGN KEY (project_id, dispatch_id) REFERENCES approved_action_executions (project_id, dispatch_id),
  CHECK ((source = 'resolver' AND actor_type = 'system' AND actor_role IS NULL AND evidence_digest IS NOT NULL
          AND resolution IN ('verified_succeeded', 'verified_failed'))
      OR (source = 'manual' AND actor_type = 'user' AND actor_role IS NOT NULL
          AND resolution IN ('confirm_succeeded', 'confirm_failed', 'abandon_unknown'))),
  CHECK ((resolution IN ('verified_succeeded', 'confirm_succeeded') AND outcome = 'succeeded')
      OR (resolution IN ('verified_failed', 'confirm_failed') AND outcome = 'failed')
      OR (resolution = 'abandon_unknown' AND outcome = 'blocked'))
);
CREATE TRIGGER approved_action_resolutions_immutable BEFORE UPDATE ON approved_action_resolutions
BEGIN
  SELECT RAISE(ABORT, 'approved_action_resolutions rows are immutable');
END;

-- The run.create receipt (ADR-0034), written in the same transaction as the Run it proves.
CREATE TABLE approved_run_action_receipts (
  dispatch_id TEXT PRIMARY KEY,
  schema_version INTEGER NOT NULL CHECK (schema_version = 1),
  approval_request_id TEXT NOT NULL,
  project_id TEXT NOT NULL,
  action_type TEXT NOT NULL CHECK (action_type = 'run.create'),
  action_digest TEXT NOT NULL CHECK (length(action_digest) = 64 AND NOT action_digest GLOB '*[^0-9a-f]*'),
  execution_attempt INTEGER NOT NULL CHECK (execution_attempt BETWEEN 1 AND 16),
  execution_version INTEGER NOT NULL CHECK (execution_version >= 1),
  started_at_ms INTEGER NOT NULL,
  idempotency_key TEXT NOT NULL,
  outcome TEXT NOT NULL CHECK (outcome = 'succeeded'),
  result_code TEXT NOT NULL CHECK (result_code = 'approved_run_created'),
  resource_type TEXT NOT NULL CHECK (resource_type = 'run'),
  resource_id TEXT NOT NULL,
  finished_at_ms INTEGER NOT NULL,
  created_at_ms INTEGER NOT NULL,
  evidence_digest TEXT NOT NULL CHECK (length(evidence_digest) = 64 AND NOT evidence_digest GLOB '*[^0-9a-f]*'),
  UNIQUE (resource_type, resource_id),
  FOREIGN KEY (project_id, dispatch_id) REFERENCES approved_action_dispatches (project_id, id),
  FOREIGN KEY (project_id, approval_request_id) REFERENCES approval_requests (project_id, id),
  FOREIGN KEY (project_id, resource_id) REFERENCES runs (project_id, id),
  CHECK (idempotency_key = dispatch_id),
  CHECK (finished_at_ms >= started_at_ms AND created_at_ms = finished_at_ms)
);
CREATE TRIGGER approved_run_action_receipts_immutable BEFORE UPDATE ON approved_run_action_receipts
BEGIN
  SELECT RAISE(ABORT, 'approved_run_action_receipts rows are immutable');
END;
