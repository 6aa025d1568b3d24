-- Project variables and secrets (docs/variables.md). A secret's value column holds sealed text.

-- name: variable_list
-- desc: A project's variables by name (at most the project cap), sealed secrets included.
SELECT name, value, secret, enabled, note, updated_at_ms FROM project_variables
WHERE project_id = :project_id ORDER BY name
LIMIT :limit

-- name: variable_upsert
-- desc: Creates or replaces one variable of a project.
INSERT INTO project_variables (project_id, name, value, secret, enabled, note, created_at_ms, updated_at_ms)
VALUES (:project_id, :name, :value, :secret, :enabled, :note, :now, :now)
ON CONFLICT (project_id, name) DO UPDATE SET value = excluded.value, secret = excluded.secret,
  enabled = excluded.enabled, note = excluded.note, updated_at_ms = excluded.updated_at_ms

-- name: variable_delete
-- desc: Removes one variable; no row when it did not exist.
DELETE FROM project_variables WHERE project_id = :project_id AND name = :name
