-- ql3 foundation: projects, principals, tasks with immutable revisions, runs, attempts, events.
CREATE TABLE projects (
  id TEXT PRIMARY KEY,
  name TEXT NOT NULL UNIQUE,
  version BIGINT NOT NULL CHECK (version >= 1),
  created_at_ms BIGINT NOT NULL
);

CREATE TABLE principals (
  id TEXT PRIMARY KEY,
  name TEXT NOT NULL,
  kind TEXT NOT NULL CHECK (kind IN ('user', 'service', 'worker')),
  is_owner INTEGER NOT NULL DEFAULT 0 CHECK (is_owner IN (0, 1)),
  token_digest TEXT NOT NULL UNIQUE,
  created_at_ms BIGINT NOT NULL,
  disabled_at_ms BIGINT
);

CREATE TABLE role_bindings (
  principal_id TEXT NOT NULL REFERENCES principals (id),
  project_id TEXT NOT NULL REFERENCES projects (id),
  role TEXT NOT NULL CHECK (role IN ('viewer', 'operator', 'approver', 'admin')),
  version BIGINT NOT NULL CHECK (version >= 1),
  PRIMARY KEY (principal_id, project_id)
);

CREATE TABLE tasks (
  id TEXT PRIMARY KEY,
  project_id TEXT NOT NULL REFERENCES projects (id),
  name TEXT NOT NULL,
  enabled INTEGER NOT NULL CHECK (enabled IN (0, 1)),
  revision INTEGER NOT NULL CHECK (revision >= 1),
  created_at_ms BIGINT NOT NULL,
  updated_at_ms BIGINT NOT NULL,
  deleted_at_ms BIGINT
);
CREATE UNIQUE INDEX tasks_live_name ON tasks (project_id, name) WHERE deleted_at_ms IS NULL;
CREATE INDEX tasks_project ON tasks (project_id, created_at_ms, id);

CREATE TABLE task_revisions (
  task_id TEXT NOT NULL REFERENCES tasks (id),
  revision INTEGER NOT NULL CHECK (revision >= 1),
  spec_json TEXT NOT NULL,
  content_digest TEXT NOT NULL,
  created_at_ms BIGINT NOT NULL,
  PRIMARY KEY (task_id, revision)
);

CREATE TABLE runs (
  id TEXT PRIMARY KEY,
  project_id TEXT NOT NULL REFERENCES projects (id),
  task_id TEXT NOT NULL REFERENCES tasks (id),
  task_revision INTEGER NOT NULL,
  trigger_type TEXT NOT NULL,
  trigger_id TEXT,
  status TEXT NOT NULL,
  version INTEGER NOT NULL CHECK (version >= 0),
  event_sequence INTEGER NOT NULL CHECK (event_sequence >= 0),
  priority INTEGER NOT NULL DEFAULT 0,
  idempotency_key TEXT,
  request_id TEXT,
  retry_of_run_id TEXT,
  scheduled_for_ms BIGINT,
  created_at_ms BIGINT NOT NULL,
  queued_at_ms BIGINT,
  started_at_ms BIGINT,
  finished_at_ms BIGINT,
  cancel_requested_at_ms BIGINT,
  cancel_reason TEXT CHECK (cancel_reason IN ('user', 'policy', 'shutdown', 'reconcile', 'timeout')),
  error_code TEXT,
  exit_code INTEGER,
  updated_at_ms BIGINT NOT NULL,
  FOREIGN KEY (task_id, task_revision) REFERENCES task_revisions (task_id, revision),
  UNIQUE (project_id, id)
);
CREATE INDEX runs_project_created ON runs (project_id, created_at_ms, id);
CREATE INDEX runs_task_created ON runs (task_id, created_at_ms);
CREATE INDEX runs_status ON runs (status, created_at_ms);
CREATE UNIQUE INDEX runs_idempotency ON runs (project_id, idempotency_key) WHERE idempotency_key IS NOT NULL;

CREATE TABLE run_attempts (
  id TEXT PRIMARY KEY,
  run_id TEXT NOT NULL REFERENCES runs (id),
  attempt INTEGER NOT NULL CHECK (attempt >= 1),
  status TEXT NOT NULL,
  executor_type TEXT NOT NULL,
  worker_id TEXT,
  pid INTEGER,
  executor_handle TEXT,
  log_artifact_id TEXT,
  deadline_at_ms BIGINT,
  callback_token_hash TEXT,
  callback_sequence INTEGER NOT NULL DEFAULT 0 CHECK (callback_sequence >= 0),
  created_at_ms BIGINT NOT NULL,
  started_at_ms BIGINT,
  finished_at_ms BIGINT,
  exit_code INTEGER,
  error_code TEXT,
  UNIQUE (run_id, attempt)
);
CREATE INDEX run_attempts_status ON run_attempts (status, created_at_ms);
CREATE INDEX run_attempts_deadline ON run_attempts (status, deadline_at_ms, id);

CREATE TABLE run_events (
  id TEXT PRIMARY KEY,
  run_id TEXT NOT NULL REFERENCES runs (id),
  sequence INTEGER NOT NULL CHECK (sequence >= 1),
  type TEXT NOT NULL,
  dedupe_key TEXT,
  actor_type TEXT NOT NULL,
  actor_id TEXT,
  attempt_id TEXT,
  payload_json TEXT NOT NULL,
  created_at_ms BIGINT NOT NULL,
  UNIQUE (run_id, sequence),
  UNIQUE (run_id, dedupe_key)
);

-- The database clock is the only time authority in cluster. Tests shift it through ql3_clock.
CREATE TABLE ql3_clock (
  singleton BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (singleton),
  offset_ms BIGINT NOT NULL DEFAULT 0
);
INSERT INTO ql3_clock (singleton, offset_ms) VALUES (TRUE, 0);

CREATE FUNCTION ql3_now_ms() RETURNS BIGINT LANGUAGE sql STABLE AS $$
  SELECT (floor(extract(epoch FROM transaction_timestamp()) * 1000))::BIGINT
         + (SELECT offset_ms FROM ql3_clock WHERE singleton)
$$;
