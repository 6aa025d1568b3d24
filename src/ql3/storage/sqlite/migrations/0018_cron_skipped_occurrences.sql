-- Skipped cron occurrences (docs/cron.md): every occurrence whose time came and that did not become a
-- run, with its reason. One row covers one occurrence or a range of consecutive ones skipped together
-- (a misfire after an outage: first and last occurrence and how many). Written in the transaction
-- that decided the skip; bounded per task by the application (the oldest rows past the cap go).
CREATE TABLE cron_skips (
  task_id TEXT NOT NULL REFERENCES tasks (id),
  occurrence_ms INTEGER NOT NULL,
  project_id TEXT NOT NULL REFERENCES projects (id),
  task_revision INTEGER NOT NULL CHECK (task_revision >= 1),
  last_occurrence_ms INTEGER NOT NULL CHECK (last_occurrence_ms >= occurrence_ms),
  occurrences INTEGER NOT NULL CHECK (occurrences >= 1),
  reason TEXT NOT NULL CHECK (reason IN ('overlap', 'misfire', 'disabled', 'deleted')),
  created_at_ms INTEGER NOT NULL,
  PRIMARY KEY (task_id, occurrence_ms)
);
CREATE INDEX cron_skips_project ON cron_skips (project_id, created_at_ms);
