-- A project's dependencies (docs/dependencies.md): one row per (project, kind, name), the validated
-- spec as the user gave it. The set is installed by runs of the project's ql3-deps task.
CREATE TABLE project_dependencies (
  project_id TEXT NOT NULL REFERENCES projects (id),
  kind TEXT NOT NULL CHECK (kind IN ('python', 'node')),
  name TEXT NOT NULL CHECK (length(name) BETWEEN 1 AND 214),
  spec TEXT NOT NULL CHECK (length(spec) BETWEEN 1 AND 200),
  created_at_ms INTEGER NOT NULL,
  updated_at_ms INTEGER NOT NULL,
  PRIMARY KEY (project_id, kind, name)
) WITHOUT ROWID;
