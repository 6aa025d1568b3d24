-- The metrics role (docs/operations.md "Prometheus"): a scrape token that reads /metrics with the
-- task names of its project as label values, and nothing else. SQLite changes a CHECK constraint only
-- by rebuilding the table; nothing references role_bindings, and its rows are copied unchanged.
CREATE TABLE role_bindings_new (
  principal_id TEXT NOT NULL REFERENCES principals (id),
  project_id TEXT NOT NULL REFERENCES projects (id),
  role TEXT NOT NULL CHECK (role IN ('viewer', 'operator', 'approver', 'admin', 'metrics')),
  version INTEGER NOT NULL CHECK (version >= 1),
  PRIMARY KEY (principal_id, project_id)
);
INSERT INTO role_bindings_new (principal_id, project_id, role, version)
  SELECT principal_id, project_id, role, version FROM role_bindings;
DROP TABLE role_bindings;
ALTER TABLE role_bindings_new RENAME TO role_bindings;
