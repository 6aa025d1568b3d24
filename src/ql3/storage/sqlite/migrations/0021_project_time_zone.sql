-- A project's default time zone (docs/tasks.md "Time zones"): the zone a cron schedule is written in
-- when its task names none. It is applied when a task is created, so changing it moves no schedule.
CREATE TABLE project_settings (
  project_id TEXT PRIMARY KEY REFERENCES projects (id),
  default_tz TEXT CHECK (default_tz IS NULL OR length(default_tz) BETWEEN 1 AND 64),
  updated_at_ms INTEGER NOT NULL
) WITHOUT ROWID;
