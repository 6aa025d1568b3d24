-- Subscriptions (docs/scripts.md "Subscriptions"): a git repository synced into a project's scripts on
-- a schedule and on demand. `deploy_key` is write-only (an SSH private key: never returned by any
-- route). Each sync is a row of `subscription_syncs` with its git output; `subscription_files` maps
-- the paths a subscription wrote to the task it made from a `cron:` header.
CREATE TABLE subscriptions (
  id TEXT PRIMARY KEY,
  project_id TEXT NOT NULL REFERENCES projects (id),
  name TEXT NOT NULL CHECK (length(name) BETWEEN 1 AND 128),
  repo_url TEXT NOT NULL CHECK (length(repo_url) BETWEEN 1 AND 2048),
  branch TEXT CHECK (branch IS NULL OR length(branch) BETWEEN 1 AND 255),
  path_glob TEXT CHECK (path_glob IS NULL OR length(path_glob) BETWEEN 1 AND 255),
  cron TEXT CHECK (cron IS NULL OR length(cron) BETWEEN 1 AND 256),
  deploy_key TEXT CHECK (deploy_key IS NULL OR length(deploy_key) BETWEEN 1 AND 16384),
  next_sync_at_ms INTEGER,
  created_at_ms INTEGER NOT NULL,
  UNIQUE (project_id, name)
);
CREATE INDEX subscriptions_due ON subscriptions (next_sync_at_ms) WHERE next_sync_at_ms IS NOT NULL;
CREATE TABLE subscription_syncs (
  id TEXT PRIMARY KEY,
  subscription_id TEXT NOT NULL REFERENCES subscriptions (id) ON DELETE CASCADE,
  project_id TEXT NOT NULL REFERENCES projects (id),
  trigger_type TEXT NOT NULL CHECK (trigger_type IN ('manual', 'schedule')),
  status TEXT NOT NULL CHECK (status IN ('running', 'succeeded', 'failed')),
  commit_sha TEXT CHECK (commit_sha IS NULL OR length(commit_sha) BETWEEN 1 AND 64),
  summary TEXT CHECK (summary IS NULL OR length(summary) <= 2000),
  log TEXT NOT NULL CHECK (length(log) <= 65536),
  started_at_ms INTEGER NOT NULL,
  ended_at_ms INTEGER
);
CREATE INDEX subscription_syncs_by_subscription ON subscription_syncs (subscription_id, started_at_ms);
CREATE TABLE subscription_files (
  subscription_id TEXT NOT NULL REFERENCES subscriptions (id) ON DELETE CASCADE,
  path TEXT NOT NULL CHECK (length(path) BETWEEN 1 AND 255),
  task_id TEXT REFERENCES tasks (id),
  PRIMARY KEY (subscription_id, path)
) WITHOUT ROWID;
