-- Cron schedules: one cursor per task, written only by the admission transaction and task changes.
CREATE TABLE task_schedules (
  task_id TEXT PRIMARY KEY REFERENCES tasks (id),
  project_id TEXT NOT NULL REFERENCES projects (id),
  task_revision INTEGER NOT NULL,
  cron_expr TEXT NOT NULL,
  next_fire_at_ms INTEGER,
  last_scheduled_at_ms INTEGER,
  state_version INTEGER NOT NULL CHECK (state_version >= 0),
  updated_at_ms INTEGER NOT NULL
);
CREATE INDEX task_schedules_due ON task_schedules (next_fire_at_ms, task_id) WHERE next_fire_at_ms IS NOT NULL;
CREATE INDEX runs_task_active ON runs (task_id, status);
