-- A project's approval policy (docs/security.md "Separation of duty"): with second_admin, a decision
-- needs an admin outside the requester's token lineage in both directions. No row: the default policy.
CREATE TABLE approval_policies (
  project_id TEXT PRIMARY KEY REFERENCES projects (id),
  second_admin INTEGER NOT NULL CHECK (second_admin IN (0, 1)),
  version INTEGER NOT NULL CHECK (version >= 1),
  updated_by TEXT NOT NULL REFERENCES principals (id),
  updated_at_ms BIGINT NOT NULL
);
