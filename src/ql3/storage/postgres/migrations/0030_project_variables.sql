-- Project variables and secrets (docs/variables.md): every task of the project receives the enabled
-- ones in its environment. A secret's value is sealed (AES-GCM, key in $QL3_HOME, never here).
CREATE TABLE project_variables (
  project_id TEXT NOT NULL REFERENCES projects (id),
  name TEXT NOT NULL CHECK (length(name) BETWEEN 1 AND 128),
  value TEXT NOT NULL,
  secret BOOLEAN NOT NULL,
  enabled BOOLEAN NOT NULL,
  note TEXT NOT NULL CHECK (length(note) <= 256),
  created_at_ms BIGINT NOT NULL,
  updated_at_ms BIGINT NOT NULL,
  PRIMARY KEY (project_id, name)
);
